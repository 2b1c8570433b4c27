#include "planner.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace rmscore {
namespace {

bool Fits(int64_t count, int64_t longest, const PlannerConfig& cfg) {
  return count <= cfg.max_batch_size && count * longest <= cfg.max_batch_tokens;
}

// Keeps a batch inside its members' deadlines by the admission's measured rate (planner.py's _Clock):
// a batch of `count` padded to `longest` must end before `deadline_us`, the earliest of its members'.
struct BatchClock {
  int64_t now_us;
  double us_per_token;  // 0: unknown, no limit
  bool InTime(int64_t count, int64_t longest, std::optional<int64_t> deadline_us) const {
    if (!deadline_us || us_per_token <= 0) return true;
    return double(count * longest) * us_per_token <= double(*deadline_us - now_us);
  }
};

std::optional<int64_t> Earliest(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// Indices into `live` (queue order among the live sequences).
struct Chosen {
  std::vector<size_t> idx;
  bool full = false;
};

// Arrival order, as many as the size, padded-token and deadline limits allow.
Chosen Fifo(const std::vector<const Waiting*>& live, const PlannerConfig& cfg, const BatchClock& clock) {
  Chosen c;
  c.idx.push_back(0);
  int64_t longest = live[0]->length;
  std::optional<int64_t> earliest = live[0]->deadline_us;
  for (size_t i = 1; i < live.size(); ++i) {
    const int64_t next_longest = std::max(longest, live[i]->length);
    const std::optional<int64_t> by = Earliest(earliest, live[i]->deadline_us);
    const int64_t count = int64_t(c.idx.size()) + 1;
    if (!Fits(count, next_longest, cfg) || !clock.InTime(count, next_longest, by)) {
      c.full = true;
      return c;
    }
    c.idx.push_back(i);
    longest = next_longest;
    earliest = by;
  }
  return c;
}

// Indices into `live` in length order (ties: queue order).
std::vector<size_t> ByLength(const std::vector<const Waiting*>& live) {
  std::vector<size_t> by_len(live.size());
  std::iota(by_len.begin(), by_len.end(), 0);
  std::sort(by_len.begin(), by_len.end(), [&](size_t a, size_t b) {
    return live[a]->length != live[b]->length ? live[a]->length < live[b]->length : a < b;
  });
  return by_len;
}

size_t Position(const std::vector<size_t>& by_len, size_t index) {
  return size_t(std::find(by_len.begin(), by_len.end(), index) - by_len.begin());
}

// Grows a window around the oldest sequence in length order (see planner.py):
// the oldest is always in, so nothing starves; each step takes the neighbour
// adding the least padding (ties: the shorter), else the other if it fits.
Chosen LengthAware(const std::vector<const Waiting*>& live, const PlannerConfig& cfg, const BatchClock& clock) {
  const std::vector<size_t> by_len = ByLength(live);
  const size_t pos = Position(by_len, 0);
  size_t lo = pos, hi = pos;
  int64_t longest = live[0]->length;
  std::optional<int64_t> earliest = live[0]->deadline_us;
  int64_t count = 1;
  auto window = [&](bool full) {
    Chosen c;
    c.idx.assign(by_len.begin() + lo, by_len.begin() + hi + 1);
    c.full = full;
    return c;
  };
  while (true) {
    const bool has_left = lo > 0, has_right = hi + 1 < by_len.size();
    if (!has_left && !has_right) return window(false);
    struct Option {
      int64_t padding;
      int side;  // 0: shorter (left), 1: longer (right); orders ties like Python's tuple sort
      int64_t new_longest;
      std::optional<int64_t> deadline_us;
    };
    Option opts[2];
    int n = 0;
    if (has_left) {
      const Waiting& w = *live[by_len[lo - 1]];
      opts[n++] = {longest - w.length, 0, longest, w.deadline_us};
    }
    if (has_right) {
      const Waiting& w = *live[by_len[hi + 1]];
      opts[n++] = {count * (w.length - longest), 1, w.length, w.deadline_us};
    }
    std::sort(opts, opts + n, [](const Option& a, const Option& b) {
      if (a.padding != b.padding) return a.padding < b.padding;
      return a.side < b.side;
    });
    const Option* pick = nullptr;
    for (int k = 0; k < n && !pick; ++k) {
      const int64_t len = opts[k].new_longest;
      if (Fits(count + 1, len, cfg) && clock.InTime(count + 1, len, Earliest(earliest, opts[k].deadline_us))) {
        pick = &opts[k];
      }
    }
    if (!pick) return window(true);
    earliest = Earliest(earliest, pick->deadline_us);
    if (pick->side == 0) {
      --lo;
    } else {
      ++hi;
      longest = pick->new_longest;
    }
    ++count;
  }
}

// The batch size, within the limits, with the most sequences per second at `length`.
int64_t BestSize(int64_t length, const PlannerConfig& cfg, const CostTable& cost) {
  int64_t best_k = 1, best_us = cost.BatchUs(1, length);
  for (int64_t k = 2; k <= cfg.max_batch_size; ++k) {
    if (!Fits(k, length, cfg)) break;
    const int64_t us = cost.BatchUs(k, length);
    if (k * best_us >= best_k * us) best_k = k, best_us = us;
  }
  return best_k;
}

// The batch holding the oldest sequence that scores the most sequences per second of model time
// (planner.py's _cost_aware). For each size k, the cheapest batch of k holding the oldest is the
// window of k in length order that ends as low as it can: the k - 1 sequences just shorter than the
// oldest, or the k shortest when fewer are shorter. Among the sizes within the limits the best ratio
// k / cost(k, longest) wins (ties: the larger batch, which clears more), compared by cross
// multiplication in integers. "Full": the best size for this batch's length on this machine is
// reached already, so waiting cannot help (on a CPU often 1; on a GPU large).
Chosen CostAware(const std::vector<const Waiting*>& live, const PlannerConfig& cfg, const CostTable& cost,
                 const BatchClock& clock) {
  const std::vector<size_t> by_len = ByLength(live);
  const size_t pos = Position(by_len, 0);
  int64_t best_k = 1, best_us = cost.BatchUs(1, live[0]->length);
  size_t best_hi = pos;
  bool in_time = true;
  const int64_t most = std::min<int64_t>(cfg.max_batch_size, int64_t(live.size()));
  for (int64_t k = 2; k <= most; ++k) {
    const size_t hi = std::max(pos, size_t(k - 1));
    const int64_t longest = live[by_len[hi]]->length;
    if (!Fits(k, longest, cfg)) break;  // k * longest only grows with k
    // The window of k holds the window of k - 1: the earliest deadline only comes sooner with k.
    std::optional<int64_t> earliest;
    if (clock.us_per_token > 0) {  // without a rate there is no cap: skip the O(k) scan
      for (size_t i = hi + 1 - size_t(k); i <= hi; ++i) earliest = Earliest(earliest, live[by_len[i]]->deadline_us);
    }
    if (!clock.InTime(k, longest, earliest)) {
      in_time = false;
      break;
    }
    const int64_t us = cost.BatchUs(k, longest);
    if (k * best_us >= best_k * us) best_k = k, best_us = us, best_hi = hi;
  }
  Chosen c;
  c.idx.assign(by_len.begin() + (best_hi + 1 - size_t(best_k)), by_len.begin() + best_hi + 1);
  c.full = !in_time || best_k >= BestSize(live[by_len[best_hi]]->length, cfg, cost);
  return c;
}

// No sequence arriving later could join (planner.py's _closed): the batch is at
// the size limit, or one more of even its current longest length would break
// the token budget. Waiting for the delay gains nothing.
bool Closed(const std::vector<const Waiting*>& live, const Chosen& c, const PlannerConfig& cfg) {
  int64_t longest = 0;
  for (size_t i : c.idx) longest = std::max(longest, live[i]->length);
  return !Fits(int64_t(c.idx.size()) + 1, longest, cfg);
}

}  // namespace

Decision Plan(const std::vector<Waiting>& queue, int64_t now_us, const PlannerConfig& cfg, const CostTable* cost,
              double us_per_token) {
  Decision d;
  std::vector<const Waiting*> live;
  live.reserve(queue.size());
  for (const Waiting& w : queue) {
    if (w.deadline_us && *w.deadline_us <= now_us) {
      d.expired.push_back(w.id);
    } else {
      live.push_back(&w);
    }
  }
  if (live.empty()) return d;

  const BatchClock clock{now_us, us_per_token};
  Chosen chosen;
  if (cfg.mode == BatchingMode::kFifo) {
    chosen = Fifo(live, cfg, clock);
  } else if (cfg.mode == BatchingMode::kCostAware) {
    if (!cost) throw std::invalid_argument("the cost_aware planner needs a cost table");
    chosen = CostAware(live, cfg, *cost, clock);
  } else {
    chosen = LengthAware(live, cfg, clock);
  }
  const int64_t due_us = live[0]->arrival_us + cfg.max_queue_delay_us;
  if (chosen.full || Closed(live, chosen, cfg) || now_us >= due_us) {
    // Report the batch in queue order.
    std::sort(chosen.idx.begin(), chosen.idx.end());
    d.batch.reserve(chosen.idx.size());
    for (size_t i : chosen.idx) d.batch.push_back(live[i]->id);
  } else {
    d.wait_us = due_us - now_us;
  }
  return d;
}

}  // namespace rmscore
