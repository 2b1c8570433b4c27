#include "planner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

namespace rmscore {
namespace {

bool Fits(int64_t count, int64_t longest, const PlannerConfig& cfg) {
  return count <= cfg.max_batch_size && count * longest <= cfg.max_batch_tokens;
}

// Keeps a batch short and inside its members' deadlines by the admission's measured rate (planner.py's
// _Clock): a batch of `count` padded to `longest` must take at most `max_batch_us` and end before
// `deadline_us`, the earliest of its members'.
struct BatchClock {
  int64_t now_us;
  double us_per_token;  // 0: unknown, no limit
  int64_t max_batch_us;  // 0: no bound
  bool InTime(int64_t count, int64_t longest, std::optional<int64_t> deadline_us) const {
    if (us_per_token <= 0) return true;
    const double run_us = double(count * longest) * us_per_token;
    if (max_batch_us > 0 && run_us > double(max_batch_us)) return false;
    return !deadline_us || run_us <= double(*deadline_us - now_us);
  }
};

std::optional<int64_t> Earliest(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// The chosen sequences' ids (any order), and whether waiting could not help.
struct Chosen {
  std::vector<uint64_t> ids;
  bool full = false;
};

// Arrival order, as many as the size, padded-token and deadline limits allow.
Chosen Fifo(const QueueIndex& index, const PlannerConfig& cfg, const BatchClock& clock) {
  Chosen c;
  auto it = index.by_arrival().begin();
  const Waiting& first = index.Get(it->second);
  c.ids.push_back(first.id);
  int64_t longest = first.length;
  std::optional<int64_t> earliest = first.deadline_us;
  for (++it; it != index.by_arrival().end(); ++it) {
    const Waiting& w = index.Get(it->second);
    const int64_t next_longest = std::max(longest, w.length);
    const std::optional<int64_t> by = Earliest(earliest, w.deadline_us);
    const int64_t count = int64_t(c.ids.size()) + 1;
    if (!Fits(count, next_longest, cfg) || !clock.InTime(count, next_longest, by)) {
      c.full = true;
      return c;
    }
    c.ids.push_back(w.id);
    longest = next_longest;
    earliest = by;
  }
  return c;
}

// The ids of by_length()[lo..hi].
std::vector<uint64_t> Window(const QueueIndex& index, size_t lo, size_t hi) {
  std::vector<uint64_t> ids;
  for (size_t i = lo; i <= hi; ++i) ids.push_back(index.by_length()[i].id);
  return ids;
}

// Grows a window around the oldest sequence in length order (see planner.py):
// the oldest is always in, so nothing starves; each step takes the neighbour
// adding the least padding (ties: the shorter), else the other if it fits.
Chosen LengthAware(const QueueIndex& index, const PlannerConfig& cfg, const BatchClock& clock) {
  const std::vector<QueueIndex::Entry>& by_len = index.by_length();
  const Waiting& oldest = index.Oldest();
  const size_t pos = index.Position(oldest);
  size_t lo = pos, hi = pos;
  int64_t longest = oldest.length;
  std::optional<int64_t> earliest = oldest.deadline_us;
  int64_t count = 1;
  while (true) {
    const bool has_left = lo > 0, has_right = hi + 1 < by_len.size();
    if (!has_left && !has_right) return Chosen{Window(index, lo, hi), false};
    struct Option {
      int64_t padding;
      int side;  // 0: shorter (left), 1: longer (right); orders ties like Python's tuple sort
      int64_t new_longest;
      std::optional<int64_t> deadline_us;
    };
    Option opts[2];
    int n = 0;
    if (has_left) {
      const Waiting& w = index.Get(by_len[lo - 1].id);
      opts[n++] = {longest - w.length, 0, longest, w.deadline_us};
    }
    if (has_right) {
      const Waiting& w = index.Get(by_len[hi + 1].id);
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
    if (!pick) return Chosen{Window(index, lo, hi), true};
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
    if (k * best_us > best_k * us) best_k = k, best_us = us;
  }
  return best_k;
}

// What scoring one sequence of `length` is worth (planner.py's _worth): its share of the model time of
// the best batch of its own length, that batch no larger than what is `queued`, in 1/kWorthScale us.
// A batch's worth is its sequences' sum, so padding counts as the waste it is.
constexpr int64_t kWorthScale = 1024;
__extension__ typedef __int128 Wide;  // GCC's and Clang's; __extension__ keeps -Wpedantic quiet
int64_t Worth(int64_t length, int64_t queued, const PlannerConfig& cfg, const CostTable& cost) {
  const int64_t k = std::min(BestSize(length, cfg, cost), queued);
  return cost.BatchUs(k, length) * kWorthScale / k;
}

// The batch holding the oldest sequence that does the most work per second of model time
// (planner.py's _cost_aware). For each size k, the cheapest batch of k holding the oldest is the
// window of k in length order that ends as low as it can: the k - 1 sequences just shorter than the
// oldest, or the k shortest when fewer are shorter. Among the sizes within the limits the best ratio
// worth(window) / cost(k, longest) wins, a window's worth being what its sequences would cost in the
// best batches of their own lengths (Worth; counting sequences instead, padded batches of 4 to 8 ran
// at 64 in flight: planner.py). Ties: the smaller batch, which answers sooner and leaves no worker
// idle behind it; the sizes the warm-up extrapolated tie with the largest it measured (planner.py).
// Compared by cross multiplication in 128-bit integers (a worth times a cost passes 2^63). "Full":
// the best size for this batch's length on this machine is reached already, so waiting cannot help
// (on a CPU often 1; on a GPU large).
Chosen CostAware(const QueueIndex& index, const PlannerConfig& cfg, const CostTable& cost, const BatchClock& clock) {
  const std::vector<QueueIndex::Entry>& by_len = index.by_length();
  const Waiting& oldest = index.Oldest();
  const size_t pos = index.Position(oldest);
  const int64_t queued = int64_t(by_len.size());
  // Worth by length, for this decision: BestSize reads every size, and a window repeats lengths.
  std::vector<std::pair<int64_t, int64_t>> worth_of;
  auto worth = [&](int64_t length) {
    for (const auto& [l, w] : worth_of) {
      if (l == length) return w;
    }
    worth_of.emplace_back(length, Worth(length, queued, cfg, cost));
    return worth_of.back().second;
  };
  int64_t best_k = 1, best_us = cost.BatchUs(1, oldest.length);
  Wide best_value = worth(oldest.length), value = best_value;
  size_t best_hi = pos;
  bool in_time = true;
  // The window of k holds the window of k - 1 and one more (it grows down to 0, then up): its earliest
  // deadline is kept as it grows, and only comes sooner with k, so the first k out of time ends it.
  std::optional<int64_t> earliest = oldest.deadline_us;
  const int64_t most = std::min<int64_t>(cfg.max_batch_size, int64_t(by_len.size()));
  for (int64_t k = 2; k <= most; ++k) {
    const size_t hi = std::max(pos, size_t(k - 1));
    const int64_t longest = by_len[hi].length;
    if (!Fits(k, longest, cfg)) break;  // k * longest only grows with k
    const size_t joined = size_t(k - 1) <= pos ? pos + 1 - size_t(k) : hi;
    earliest = Earliest(earliest, index.Get(by_len[joined].id).deadline_us);
    if (!clock.InTime(k, longest, earliest)) {
      in_time = false;
      break;
    }
    value += worth(by_len[joined].length);
    const int64_t us = cost.BatchUs(k, longest);
    if (value * best_us > best_value * us) best_value = value, best_k = k, best_us = us, best_hi = hi;
  }
  Chosen c{Window(index, best_hi + 1 - size_t(best_k), best_hi), false};
  c.full = !in_time || best_k >= BestSize(by_len[best_hi].length, cfg, cost);
  return c;
}

// No sequence arriving later could join (planner.py's _closed): the batch is at
// the size limit, or one more of even its current longest length would break
// the token budget. Waiting for the delay gains nothing.
bool Closed(const QueueIndex& index, const Chosen& c, const PlannerConfig& cfg) {
  int64_t longest = 0;
  for (uint64_t id : c.ids) longest = std::max(longest, index.Get(id).length);
  return !Fits(int64_t(c.ids.size()) + 1, longest, cfg);
}

}  // namespace

void QueueIndex::Add(const Waiting& w, int64_t rank) {
  by_id_.emplace(w.id, Held{w, rank});
  by_arrival_.emplace(std::make_pair(rank, w.id), w.id);
  const Entry e{w.length, rank, w.id};
  by_length_.insert(std::lower_bound(by_length_.begin(), by_length_.end(), e), e);
  if (w.deadline_us) deadlines_.emplace(*w.deadline_us, w.id);
}

bool QueueIndex::Remove(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  const auto& [w, rank] = it->second;
  by_arrival_.erase(std::make_pair(rank, id));
  by_length_.erase(std::lower_bound(by_length_.begin(), by_length_.end(), Entry{w.length, rank, id}));
  if (w.deadline_us) deadlines_.erase({*w.deadline_us, id});
  by_id_.erase(it);
  return true;
}

int64_t QueueIndex::TokensThrough(int64_t rank) const {
  int64_t tokens = 0;
  for (auto it = by_arrival_.begin(); it != by_arrival_.end() && it->first.first <= rank; ++it) {
    tokens += by_id_.at(it->second).w.length;
  }
  return tokens;
}

size_t QueueIndex::Position(const Waiting& w) const {
  return size_t(std::lower_bound(by_length_.begin(), by_length_.end(), Entry{w.length, Rank(w.id), w.id}) -
                by_length_.begin());
}

std::vector<uint64_t> QueueIndex::Expired(int64_t now_us) const {
  std::vector<uint64_t> out;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now_us; ++it) out.push_back(it->second);
  return out;
}

void ArrivalRate::Add(int64_t count, int64_t now_us) {
  rate_ = PerS(now_us) + double(count) * 1e6 / double(kTauUs);
  at_us_ = now_us;
}

double ArrivalRate::PerS(int64_t now_us) const {
  if (!at_us_) return 0;
  return rate_ * std::exp(-double(std::max<int64_t>(0, now_us - *at_us_)) / double(kTauUs));
}

Decision PlanLive(const QueueIndex& index, int64_t now_us, const PlannerConfig& cfg, const CostTable* cost,
                  double us_per_token, double arrivals_per_s) {
  Decision d;
  if (index.size() == 0) return d;
  const BatchClock clock{now_us, us_per_token, cfg.max_batch_us};
  Chosen chosen;
  if (cfg.mode == BatchingMode::kFifo) {
    chosen = Fifo(index, cfg, clock);
  } else if (cfg.mode == BatchingMode::kCostAware) {
    if (!cost) throw std::invalid_argument("the cost_aware planner needs a cost table");
    chosen = CostAware(index, cfg, *cost, clock);
  } else {
    chosen = LengthAware(index, cfg, clock);
  }
  const int64_t due_us = index.Oldest().arrival_us + cfg.max_queue_delay_us;
  // No partner expected before the delay ends (planner.py's _alone): waiting could only cost.
  const bool alone = arrivals_per_s > 0 && arrivals_per_s * double(due_us - now_us) < 1e6;
  if (chosen.full || Closed(index, chosen, cfg) || now_us >= due_us || alone) {
    // Report the batch in queue order.
    std::sort(chosen.ids.begin(), chosen.ids.end(),
              [&](uint64_t a, uint64_t b) { return std::make_pair(index.Rank(a), a) < std::make_pair(index.Rank(b), b); });
    d.batch = std::move(chosen.ids);
  } else {
    d.wait_us = due_us - now_us;
  }
  return d;
}

Decision Plan(const std::vector<Waiting>& queue, int64_t now_us, const PlannerConfig& cfg, const CostTable* cost,
              double us_per_token, double arrivals_per_s) {
  Decision d;
  QueueIndex index;
  int64_t rank = 0;
  for (const Waiting& w : queue) {
    if (w.deadline_us && *w.deadline_us <= now_us) {
      d.expired.push_back(w.id);
    } else {
      index.Add(w, rank++);
    }
  }
  Decision live = PlanLive(index, now_us, cfg, cost, us_per_token, arrivals_per_s);
  d.batch = std::move(live.batch);
  d.wait_us = live.wait_us;
  return d;
}

}  // namespace rmscore
