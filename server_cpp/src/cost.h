// What a batch costs on this machine: the cost model the `cost_aware` planner optimises.
// server_py/rmscore/core/cost.py and cost_profile.py in C++, with the same names and steps; the
// integer arithmetic is held to the same values by contract/batching_vectors.json ("cost_tables").
//
// A CostTable holds the model time, in integer microseconds, of a batch of B sequences padded to L
// tokens at the points of a grid. Between grid points it interpolates linearly, over L first and
// then over B; past the last point it extrapolates in proportion; below the first it takes the first
// point. Make() makes it non-decreasing along both axes, which keeps every difference the
// interpolation takes non-negative: C++ division truncates where Python's floors, and on
// non-negative numbers they agree.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rmscore {

// A table that cannot be built; what() quotes what is wrong (Python's CostError).
struct CostError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct CostTable {
  std::vector<int64_t> batch_sizes;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int64_t>> cost_us;  // [batch index][length index]

  // Validates the grid (quoting what is wrong) and makes the costs non-decreasing in B and L. Throws CostError.
  static CostTable Make(std::vector<int64_t> batch_sizes, std::vector<int64_t> lengths,
                        std::vector<std::vector<int64_t>> cost_us);
  // Model microseconds of `count` sequences padded to `length` tokens (both >= 1).
  int64_t BatchUs(int64_t count, int64_t length) const;

  nlohmann::json ToJson() const;
  static CostTable FromJson(const nlohmann::json& doc);  // throws CostError
};

// The table a server plans with, refined online. Not thread-safe: the batcher holds its lock around
// table() and Observe().
class CostModel {
 public:
  // Weight of one observed batch in its grid cell: about the last 10 batches of that shape count.
  static constexpr double kAlpha = 0.1;

  explicit CostModel(CostTable table);
  const CostTable& table() const { return table_; }
  int64_t observed() const { return observed_; }
  // One batch of `count` sequences padded to `length` took `seconds`. Its nearest grid cell moves
  // toward it, the observation scaled by the table's own ratio between the two shapes (so a batch of
  // 6 refines the cell of 8 without being read as a batch of 8).
  void Observe(int64_t count, int64_t length, double seconds);

 private:
  CostTable table_;
  std::vector<std::vector<double>> cells_;
  int64_t observed_ = 0;
};

// The warm-up grid: powers of two up to the limits (the limits themselves included).
std::pair<std::vector<int64_t>, std::vector<int64_t>> Grid(int64_t max_batch_size, int64_t max_length);

}  // namespace rmscore
