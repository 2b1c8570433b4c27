#include "planner.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace rmscore {
namespace {

bool Fits(int64_t count, int64_t longest, const PlannerConfig& cfg) {
  return count <= cfg.max_batch_size && count * longest <= cfg.max_batch_tokens;
}

// Indices into `live` (queue order among the live sequences).
struct Chosen {
  std::vector<size_t> idx;
  bool full = false;
};

// Arrival order, as many as the size and padded-token limits allow.
Chosen Fifo(const std::vector<const Waiting*>& live, const PlannerConfig& cfg) {
  Chosen c;
  c.idx.push_back(0);
  int64_t longest = live[0]->length;
  for (size_t i = 1; i < live.size(); ++i) {
    const int64_t next_longest = std::max(longest, live[i]->length);
    if (!Fits(int64_t(c.idx.size()) + 1, next_longest, cfg)) {
      c.full = true;
      return c;
    }
    c.idx.push_back(i);
    longest = next_longest;
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
Chosen LengthAware(const std::vector<const Waiting*>& live, const PlannerConfig& cfg) {
  const std::vector<size_t> by_len = ByLength(live);
  const size_t pos = Position(by_len, 0);
  size_t lo = pos, hi = pos;
  int64_t longest = live[0]->length;
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
    };
    Option opts[2];
    int n = 0;
    if (has_left) opts[n++] = {longest - live[by_len[lo - 1]]->length, 0, longest};
    if (has_right) {
      const int64_t len = live[by_len[hi + 1]]->length;
      opts[n++] = {count * (len - longest), 1, len};
    }
    std::sort(opts, opts + n, [](const Option& a, const Option& b) {
      if (a.padding != b.padding) return a.padding < b.padding;
      if (a.side != b.side) return a.side < b.side;
      return a.new_longest < b.new_longest;
    });
    const Option* pick = nullptr;
    for (int k = 0; k < n && !pick; ++k) {
      if (Fits(count + 1, opts[k].new_longest, cfg)) pick = &opts[k];
    }
    if (!pick) return window(true);
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
Chosen CostAware(const std::vector<const Waiting*>& live, const PlannerConfig& cfg, const CostTable& cost) {
  const std::vector<size_t> by_len = ByLength(live);
  const size_t pos = Position(by_len, 0);
  int64_t best_k = 1, best_us = cost.BatchUs(1, live[0]->length);
  size_t best_hi = pos;
  const int64_t most = std::min<int64_t>(cfg.max_batch_size, int64_t(live.size()));
  for (int64_t k = 2; k <= most; ++k) {
    const size_t hi = std::max(pos, size_t(k - 1));
    const int64_t longest = live[by_len[hi]]->length;
    if (!Fits(k, longest, cfg)) break;  // k * longest only grows with k
    const int64_t us = cost.BatchUs(k, longest);
    if (k * best_us >= best_k * us) best_k = k, best_us = us, best_hi = hi;
  }
  Chosen c;
  c.idx.assign(by_len.begin() + (best_hi + 1 - size_t(best_k)), by_len.begin() + best_hi + 1);
  c.full = best_k >= BestSize(live[by_len[best_hi]]->length, cfg, cost);
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

Decision Plan(const std::vector<Waiting>& queue, int64_t now_us, const PlannerConfig& cfg, const CostTable* cost) {
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

  Chosen chosen;
  if (cfg.mode == BatchingMode::kFifo) {
    chosen = Fifo(live, cfg);
  } else if (cfg.mode == BatchingMode::kCostAware) {
    if (!cost) throw std::invalid_argument("the cost_aware planner needs a cost table");
    chosen = CostAware(live, cfg, *cost);
  } else {
    chosen = LengthAware(live, cfg);
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
