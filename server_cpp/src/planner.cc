#include "planner.h"

#include <algorithm>
#include <numeric>

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

// Grows a window around the oldest sequence in length order (see planner.py):
// the oldest is always in, so nothing starves; each step takes the neighbour
// adding the least padding (ties: the shorter), else the other if it fits.
Chosen LengthAware(const std::vector<const Waiting*>& live, const PlannerConfig& cfg) {
  std::vector<size_t> by_len(live.size());
  std::iota(by_len.begin(), by_len.end(), 0);
  std::sort(by_len.begin(), by_len.end(), [&](size_t a, size_t b) {
    return live[a]->length != live[b]->length ? live[a]->length < live[b]->length : a < b;
  });
  const size_t pos = size_t(std::find(by_len.begin(), by_len.end(), size_t{0}) - by_len.begin());
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

// No sequence arriving later could join (planner.py's _closed): the batch is at
// the size limit, or one more of even its current longest length would break
// the token budget. Waiting for the delay gains nothing.
bool Closed(const std::vector<const Waiting*>& live, const Chosen& c, const PlannerConfig& cfg) {
  int64_t longest = 0;
  for (size_t i : c.idx) longest = std::max(longest, live[i]->length);
  return !Fits(int64_t(c.idx.size()) + 1, longest, cfg);
}

}  // namespace

Decision Plan(const std::vector<Waiting>& queue, int64_t now_us, const PlannerConfig& cfg) {
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

  Chosen chosen = cfg.mode == BatchingMode::kFifo ? Fifo(live, cfg) : LengthAware(live, cfg);
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
