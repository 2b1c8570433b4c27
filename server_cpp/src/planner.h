// The batching policy as a pure function: server_py/rmscore/core/planner.py in C++,
// held to the same vectors (contract/batching_vectors.json). Integer
// microseconds everywhere so both implementations decide identically. The
// cost_aware mode takes the machine's cost table (cost.h) as a further input.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "cost.h"

namespace rmscore {

struct PlannerConfig {
  int64_t max_batch_size = 32;
  int64_t max_batch_tokens = 8192;
  int64_t max_queue_delay_us = 2000;
  BatchingMode mode = BatchingMode::kLengthAware;
  int64_t max_batch_us = 0;  // a batch grows only while its expected time stays within it (0: no bound)
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

// The live waiting sequences in the orders the planner searches, kept as they change (planner.py's
// QueueIndex): queue order (by (rank, id)), length (a sorted vector of (length, rank, id): equal lengths
// keep the queue order) and deadline. The rank is the queue order: the batcher gives each sequence its
// caller's turn (batcher.h, "fair order"), so a new caller's sequence may rank before sequences that
// arrived earlier; equal ranks keep their ids' order. The oldest, which every batch holds, is the lowest
// rank. The batcher keeps one beside its queue, so a decision reads
// O(max_batch_size) entries and binary searches whatever is queued instead of rebuilding and sorting
// every waiting sequence (1.7 ms at 4,096 queued, paid per sequence when the planner picks batches of
// one). Plan builds one from a list. Not thread-safe: the batcher's mu_ guards it.
class QueueIndex {
 public:
  struct Entry {
    int64_t length;
    int64_t rank;
    uint64_t id;
    bool operator<(const Entry& o) const {
      if (length != o.length) return length < o.length;
      return rank != o.rank ? rank < o.rank : id < o.id;
    }
  };
  // `rank`: the sequence's place in the queue order (ties: by id).
  void Add(const Waiting& w, int64_t rank);
  bool Remove(uint64_t id);
  size_t size() const { return by_id_.size(); }
  const Waiting& Get(uint64_t id) const { return by_id_.at(id).w; }
  int64_t Rank(uint64_t id) const { return by_id_.at(id).rank; }
  const Waiting& Oldest() const { return Get(by_arrival_.begin()->second); }
  // The lowest rank queued (the index must not be empty).
  int64_t FirstRank() const { return by_arrival_.begin()->first.first; }
  // Real tokens of the sequences ranked at or before `rank`: what runs before a sequence added now at
  // `rank` (equal ranks keep their ids' order, and a new id is the highest). Walks them: admission's
  // cost, at most the queue.
  int64_t TokensThrough(int64_t rank) const;
  // (rank, id) -> id, in queue order.
  const std::map<std::pair<int64_t, uint64_t>, uint64_t>& by_arrival() const { return by_arrival_; }
  const std::vector<Entry>& by_length() const { return by_length_; }
  // Where `w` sits in by_length().
  size_t Position(const Waiting& w) const;
  // Ids whose deadline is at or before `now_us`, soonest first (ties: id); they stay until removed.
  std::vector<uint64_t> Expired(int64_t now_us) const;

 private:
  struct Held {
    Waiting w;
    int64_t rank;
  };
  std::unordered_map<uint64_t, Held> by_id_;
  std::map<std::pair<int64_t, uint64_t>, uint64_t> by_arrival_;
  std::vector<Entry> by_length_;
  std::set<std::pair<int64_t, uint64_t>> deadlines_;
};

// Sequences arriving per second, from the arrivals of the last few kTauUs (planner.py's ArrivalRate):
// each counts exp(-age / kTauUs) / kTauUs, so a steady rate reads as itself and an idle spell decays
// towards 0. The batcher keeps one under mu_ and hands PerS to the planner.
class ArrivalRate {
 public:
  static constexpr int64_t kTauUs = 200000;
  void Add(int64_t count, int64_t now_us);
  double PerS(int64_t now_us) const;

 private:
  double rate_ = 0;  // per second, as of at_us_
  std::optional<int64_t> at_us_;
};

// Plan over an index of live sequences (none expired at `now_us`: the caller removed them); `expired`
// stays empty. `arrivals_per_s` > 0 (ArrivalRate): a batch neither full nor due runs at once when fewer
// than one sequence is expected before the delay ends (planner.py's module docstring).
Decision PlanLive(const QueueIndex& index, int64_t now_us, const PlannerConfig& cfg, const CostTable* cost = nullptr,
                  double us_per_token = 0, double arrivals_per_s = 0);

// `queue` is in arrival order; ids are unique. The reference form: it indexes the live sequences and
// asks PlanLive, as the batcher does with the index it keeps. `cost` is required by cost_aware (std::invalid_argument
// without it) and ignored by the other modes. `us_per_token` > 0 (the admission's measured model
// microseconds per token) keeps every batch inside its members' deadlines: it grows only while its
// padded tokens times that rate end before the earliest of them; the oldest still runs, alone if need be.
Decision Plan(const std::vector<Waiting>& queue, int64_t now_us, const PlannerConfig& cfg,
              const CostTable* cost = nullptr, double us_per_token = 0, double arrivals_per_s = 0);

}  // namespace rmscore
