// The batching policy as a pure function: server_py/rmscore/core/planner.py in C++,
// held to the same vectors (contract/batching_vectors.json). Integer
// microseconds everywhere so both implementations decide identically. The
// cost_aware mode takes the machine's cost table (cost.h) as a further input.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "config.h"
#include "cost.h"

namespace rmscore {

struct PlannerConfig {
  int64_t max_batch_size = 32;
  int64_t max_batch_tokens = 8192;
  int64_t max_queue_delay_us = 2000;
  BatchingMode mode = BatchingMode::kLengthAware;
};

// One queued sequence. No deadline: std::nullopt.
struct Waiting {
  uint64_t id = 0;
  int64_t arrival_us = 0;
  int64_t length = 0;
  std::optional<int64_t> deadline_us;
};

struct Decision {
  std::vector<uint64_t> expired;  // deadline passed: remove, fail their requests
  std::vector<uint64_t> batch;    // run now, in queue order; empty when waiting
  // When `batch` is empty: microseconds until the next call is due
  // (nullopt: nothing waits, sleep until something arrives).
  std::optional<int64_t> wait_us;
};

// `queue` is in arrival order; ids are unique. `cost` is required by cost_aware (std::invalid_argument
// without it) and ignored by the other modes. `us_per_token` > 0 (the admission's measured model
// microseconds per token) keeps every batch inside its members' deadlines: it grows only while its
// padded tokens times that rate end before the earliest of them; the oldest still runs, alone if need be.
Decision Plan(const std::vector<Waiting>& queue, int64_t now_us, const PlannerConfig& cfg,
              const CostTable* cost = nullptr, double us_per_token = 0);

}  // namespace rmscore
