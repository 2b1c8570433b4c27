#include "cost.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace rmscore {
namespace {

using nlohmann::json;

// A list as Python's repr writes it ("[1, 2]"), so the messages match cost.py's.
std::string Repr(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string Repr(const std::vector<std::vector<int64_t>>& rows) {
  std::string out = "[";
  for (size_t i = 0; i < rows.size(); ++i) out += (i ? ", " : "") + Repr(rows[i]);
  return out + "]";
}

std::vector<int64_t> NonDecreasing(const std::vector<int64_t>& values) {
  std::vector<int64_t> out;
  int64_t top = 0;
  for (int64_t v : values) {
    top = std::max(top, v);
    out.push_back(top);
  }
  return out;
}

// f at x from f at the grid points xs (ascending): linear between points, the first point's value
// below them, proportional past the last. Every difference is >= 0 (the table is non-decreasing), so
// `/` truncating is Python's `//` flooring.
int64_t Interp(const std::vector<int64_t>& xs, int64_t x, const std::function<int64_t(size_t)>& f) {
  if (x <= xs[0]) return f(0);
  const size_t last = xs.size() - 1;
  if (x >= xs[last]) return f(last) * x / xs[last];
  const size_t i = size_t(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin()) - 1;  // bisect_right - 1
  const int64_t lo = f(i), hi = f(i + 1);
  return lo + (hi - lo) * (x - xs[i]) / (xs[i + 1] - xs[i]);
}

void CheckAxis(const char* name, const std::vector<int64_t>& axis) {
  bool ok = !axis.empty();
  for (size_t i = 0; ok && i < axis.size(); ++i) ok = axis[i] >= 1 && (i == 0 || axis[i] > axis[i - 1]);
  if (!ok) throw CostError(std::string("cost table ") + name + " must be ascending integers >= 1, got " + Repr(axis));
}

// An integer as Python's int() takes a JSON number (a float is truncated); anything else is a type error.
int64_t IntOf(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) return int64_t(v.get<double>());
  throw CostError(std::string("cost table needs batch_sizes, lengths and cost_us: a ") + v.type_name() +
                  " where an integer belongs");
}

std::vector<int64_t> IntsOf(const json& v) {
  if (!v.is_array()) {
    throw CostError(std::string("cost table needs batch_sizes, lengths and cost_us: a ") + v.type_name() +
                    " where a list belongs");
  }
  std::vector<int64_t> out;
  for (const json& x : v) out.push_back(IntOf(x));
  return out;
}

}  // namespace

// ---- CostTable ---------------------------------------------------------------------------------------

CostTable CostTable::Make(std::vector<int64_t> batch_sizes, std::vector<int64_t> lengths,
                          std::vector<std::vector<int64_t>> cost_us) {
  CheckAxis("batch_sizes", batch_sizes);
  CheckAxis("lengths", lengths);
  bool shaped = cost_us.size() == batch_sizes.size();
  std::vector<int64_t> row_lengths;
  for (const auto& row : cost_us) {
    row_lengths.push_back(int64_t(row.size()));
    shaped = shaped && row.size() == lengths.size();
  }
  if (!shaped) {
    throw CostError("cost table cost_us must be " + std::to_string(batch_sizes.size()) + " rows of " +
                    std::to_string(lengths.size()) + " values, got " + Repr(row_lengths) + " row lengths");
  }
  for (const auto& row : cost_us) {
    for (int64_t v : row) {
      if (v < 1) throw CostError("cost table cost_us must be integers >= 1 microsecond, got " + Repr(cost_us));
    }
  }
  for (auto& row : cost_us) row = NonDecreasing(row);  // along L
  for (size_t j = 0; j < lengths.size(); ++j) {        // along B
    int64_t top = 0;
    for (auto& row : cost_us) row[j] = top = std::max(top, row[j]);
  }
  return CostTable{std::move(batch_sizes), std::move(lengths), std::move(cost_us)};
}

int64_t CostTable::BatchUs(int64_t count, int64_t length) const {
  return Interp(batch_sizes, count,
                [&](size_t i) { return Interp(lengths, length, [&](size_t j) { return cost_us[i][j]; }); });
}

json CostTable::ToJson() const { return json{{"batch_sizes", batch_sizes}, {"lengths", lengths}, {"cost_us", cost_us}}; }

CostTable CostTable::FromJson(const json& doc) {
  for (const char* key : {"batch_sizes", "lengths", "cost_us"}) {
    if (!doc.is_object() || !doc.contains(key)) {
      throw CostError(std::string("cost table needs batch_sizes, lengths and cost_us: ") +
                      (doc.is_object() ? std::string("no ") + key : std::string("a ") + doc.type_name()));
    }
  }
  std::vector<std::vector<int64_t>> rows;
  if (!doc["cost_us"].is_array()) IntsOf(doc["cost_us"]);  // throws, naming the type
  for (const json& row : doc["cost_us"]) rows.push_back(IntsOf(row));
  return Make(IntsOf(doc["batch_sizes"]), IntsOf(doc["lengths"]), std::move(rows));
}

// ---- CostModel ---------------------------------------------------------------------------------------

CostModel::CostModel(CostTable table) : table_(std::move(table)) {
  for (const auto& row : table_.cost_us) cells_.emplace_back(row.begin(), row.end());
}

namespace {
// The index of the grid point nearest x (the first on a tie, as Python's min).
size_t Nearest(const std::vector<int64_t>& xs, int64_t x) {
  size_t best = 0;
  for (size_t k = 1; k < xs.size(); ++k) {
    if (std::llabs(xs[k] - x) < std::llabs(xs[best] - x)) best = k;
  }
  return best;
}
}  // namespace

void CostModel::Observe(int64_t count, int64_t length, double seconds) {
  const CostTable& t = table_;
  const size_t i = Nearest(t.batch_sizes, count), j = Nearest(t.lengths, length);
  const int64_t predicted = t.BatchUs(count, length);
  const double at_cell = seconds * 1e6 * double(t.cost_us[i][j]) / double(std::max<int64_t>(1, predicted));
  cells_[i][j] += kAlpha * (at_cell - cells_[i][j]);
  std::vector<std::vector<int64_t>> rows;
  for (const auto& row : cells_) {
    rows.emplace_back();
    // nearbyint rounds half to even in the default mode, as Python's round().
    for (double v : row) rows.back().push_back(std::max<int64_t>(1, int64_t(std::nearbyint(v))));
  }
  table_ = CostTable::Make(t.batch_sizes, t.lengths, std::move(rows));
  ++observed_;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> Grid(int64_t max_batch_size, int64_t max_length) {
  auto axis = [](int64_t limit, int64_t start) {
    std::vector<int64_t> out;
    for (int64_t v = start; v < limit; v *= 2) out.push_back(v);
    out.push_back(limit);
    return out;
  };
  return {axis(max_batch_size, 1), max_length > 16 ? axis(max_length, 16) : std::vector<int64_t>{max_length}};
}

}  // namespace rmscore
