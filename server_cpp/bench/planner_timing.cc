// rmscore-planner-timing QUEUED REPEATS: how long one batching decision takes with QUEUED sequences
// waiting, in C++, for `rmscore bench --planning` (tools/rmscore_tools/bench/planning.py, which
// times the Python planner the same way). Two forms per mode: the queue rebuilt as a list and planned
// (Plan, what the batcher did at every wake-up before it kept an index) and the kept index
// (QueueIndex::Expired + PlanLive, what it does now). One JSON line: {"mode": {"rebuilt_us": x,
// "index_us": y}, ...}, microseconds per decision, each the best of REPEATS timed rounds.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cost.h"
#include "planner.h"

namespace {

using rmscore::BatchingMode;
using Clock = std::chrono::steady_clock;

// The best of `repeats` rounds of `n` calls, in microseconds per call.
template <typename F>
double BestUs(int repeats, int n, F f) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point t = Clock::now();
    for (int i = 0; i < n; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t).count() / n);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t queued = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  // The shape planning.py uses: lengths uniform in 16..512, half with a far deadline, a CPU-like table.
  const std::vector<int64_t> sizes{1, 2, 4, 8, 16, 32}, lengths{16, 32, 64, 128, 256, 512};
  std::vector<std::vector<int64_t>> cost_us;
  for (int64_t b : sizes) {
    std::vector<int64_t> row;
    for (int64_t n : lengths) row.push_back(300 + 12 * b * n * (4 + b) / 4);
    cost_us.push_back(row);
  }
  const rmscore::CostTable table = rmscore::CostTable::Make(sizes, lengths, cost_us);
  std::mt19937_64 rng(0);
  std::vector<rmscore::Waiting> queue;
  rmscore::QueueIndex index;
  const int64_t now = 1'000'000, far = now * 1000;
  for (int64_t i = 0; i < queued; ++i) {
    std::optional<int64_t> deadline;
    if (i % 2 == 0) deadline = far;
    queue.push_back(rmscore::Waiting{uint64_t(i + 1), i, 16 + int64_t(rng() % 497), deadline});
    index.Add(queue.back(), i);
  }
  nlohmann::ordered_json out;
  for (auto [name, mode] : {std::pair{"cost_aware", BatchingMode::kCostAware},
                            std::pair{"length_aware", BatchingMode::kLengthAware}, std::pair{"fifo", BatchingMode::kFifo}}) {
    const rmscore::PlannerConfig cfg{32, 8192, 2000, mode};
    volatile size_t sink = 0;
    const double rebuilt = BestUs(repeats, 20, [&] { sink = sink + Plan(queue, now, cfg, &table, 3.0).batch.size(); });
    const double kept = BestUs(repeats, 2000, [&] {
      sink = sink + index.Expired(now).size() + PlanLive(index, now, cfg, &table, 3.0).batch.size();
    });
    out[name] = {{"rebuilt_us", rebuilt}, {"index_us", kept}};
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
