"""The batching policy as a pure function (docs/batching.md is its prose form).

Given the waiting sequences and the time now, `plan` says which sequences to
drop (deadline passed), and either which sequences form the next batch or how
long to wait before asking again. The C++ server implements the same function
(server_cpp/src/planner.cc) and both are held to contract/batching_vectors.json.

All times are integer microseconds so the two implementations agree exactly.
The `cost_aware` mode takes the machine's cost table (cost.py) as a further input.

Every mode also keeps a batch inside its members' deadlines: with `us_per_token` (the admission's
measured model microseconds per token, admission.py; 0: unknown) a batch grows only while its
padded tokens times that rate end before the earliest deadline among its members. The oldest
sequence still runs, alone if need be. Without it a 4-token request with a 2 s deadline, batched
with fifteen 512-token ones, waited out its deadline inside a 4 s batch (docs/hardening.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from rmscore.core.cost import CostTable

FIFO = "fifo"
LENGTH_AWARE = "length_aware"
COST_AWARE = "cost_aware"
MODES = (FIFO, LENGTH_AWARE, COST_AWARE)


@dataclass(frozen=True)
class PlannerConfig:
    max_batch_size: int
    max_batch_tokens: int
    max_queue_delay_us: int
    mode: str = LENGTH_AWARE


@dataclass(frozen=True)
class Waiting:
    """One queued sequence. `deadline_us` None means no deadline."""

    id: int
    arrival_us: int
    length: int
    deadline_us: int | None = None


@dataclass
class Decision:
    # Ids whose deadline has passed: remove them, fail their requests.
    expired: list[int] = field(default_factory=list)
    # Ids of the batch to run now, in queue order; empty when waiting.
    batch: list[int] = field(default_factory=list)
    # When `batch` is empty: microseconds until the next call is due
    # (None: nothing waits, sleep until something arrives).
    wait_us: int | None = None


def plan(queue: Sequence[Waiting], now_us: int, cfg: PlannerConfig, cost: CostTable | None = None,
         us_per_token: float = 0.0) -> Decision:
    """`queue` is in arrival (queue) order; ids are unique. `cost` is required by `cost_aware`;
    `us_per_token` > 0 keeps each batch inside its members' deadlines (module docstring)."""
    decision = Decision()
    live = []
    for w in queue:
        if w.deadline_us is not None and w.deadline_us <= now_us:
            decision.expired.append(w.id)
        else:
            live.append(w)
    if not live:
        return decision

    clock = _Clock(now_us, us_per_token)
    if cfg.mode == FIFO:
        chosen, full = _fifo(live, cfg, clock)
    elif cfg.mode == COST_AWARE:
        if cost is None:
            raise ValueError("the cost_aware planner needs a cost table")
        chosen, full = _cost_aware(live, cfg, cost, clock)
    else:
        chosen, full = _length_aware(live, cfg, clock)

    oldest = live[0]
    due_us = oldest.arrival_us + cfg.max_queue_delay_us
    if full or _closed(live, chosen, cfg) or now_us >= due_us:
        order = {w.id: i for i, w in enumerate(live)}
        decision.batch = sorted(chosen, key=order.__getitem__)
    else:
        decision.wait_us = due_us - now_us
    return decision


def _fits(count: int, longest: int, cfg: PlannerConfig) -> bool:
    return count <= cfg.max_batch_size and count * longest <= cfg.max_batch_tokens


@dataclass(frozen=True)
class _Clock:
    now_us: int
    us_per_token: float

    def in_time(self, count: int, longest: int, deadline_us: int | None) -> bool:
        """A batch of `count` padded to `longest` ends before `deadline_us` (the earliest of its
        members'), by the measured rate; always true when either is unknown. C++ computes the same
        double product (planner.cc), so both compare alike."""
        if deadline_us is None or self.us_per_token <= 0:
            return True
        return float(count * longest) * self.us_per_token <= float(deadline_us - self.now_us)


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _closed(live: list[Waiting], chosen: list[int], cfg: PlannerConfig) -> bool:
    """No sequence arriving later could join: the batch is at the size limit, or one more of even
    its current longest length would break the token budget. Waiting for the delay gains nothing."""
    ids = set(chosen)
    longest = max(w.length for w in live if w.id in ids)
    return not _fits(len(chosen) + 1, longest, cfg)


def _fifo(live: list[Waiting], cfg: PlannerConfig, clock: _Clock) -> tuple[list[int], bool]:
    """Arrival order, as many as the size, padded-token and deadline limits allow."""
    chosen = [live[0].id]
    longest, earliest = live[0].length, live[0].deadline_us
    for w in live[1:]:
        n, by = max(longest, w.length), _earliest(earliest, w.deadline_us)
        if not (_fits(len(chosen) + 1, n, cfg) and clock.in_time(len(chosen) + 1, n, by)):
            return chosen, True
        chosen.append(w.id)
        longest, earliest = n, by
    return chosen, False


def _length_aware(live: list[Waiting], cfg: PlannerConfig, clock: _Clock) -> tuple[list[int], bool]:
    """Grow a window around the oldest sequence in length order.

    The oldest sequence is always in the batch, so nothing starves. Each step
    adds the neighbour (next shorter or next longer) that adds the least
    padding (ties: the shorter one); if it would break a limit, the other one is
    tried. The batch is "full" when neighbours remain but none fits.
    """
    by_len = sorted(range(len(live)), key=lambda i: (live[i].length, i))
    pos = by_len.index(0)  # index 0 of `live` is the oldest
    lo = hi = pos
    longest, earliest = live[0].length, live[0].deadline_us
    count = 1
    while True:
        left = by_len[lo - 1] if lo > 0 else None
        right = by_len[hi + 1] if hi + 1 < len(by_len) else None
        if left is None and right is None:
            return [live[i].id for i in by_len[lo:hi + 1]], False
        # Padding each choice adds: a shorter one pads itself up to `longest`;
        # a longer one pads every sequence already chosen up to its length.
        options = []
        if left is not None:
            options.append((longest - live[left].length, 0, longest, live[left].deadline_us))
        if right is not None:
            options.append((count * (live[right].length - longest), 1, live[right].length, live[right].deadline_us))
        options.sort(key=lambda o: o[:2])  # least padding first; ties: shorter (0) first
        for _, side, new_longest, deadline in options:
            by = _earliest(earliest, deadline)
            if _fits(count + 1, new_longest, cfg) and clock.in_time(count + 1, new_longest, by):
                break
        else:
            return [live[i].id for i in by_len[lo:hi + 1]], True
        if side == 0:
            lo -= 1
        else:
            hi += 1
            longest = new_longest
        earliest = by
        count += 1


def _cost_aware(live: list[Waiting], cfg: PlannerConfig, cost: CostTable, clock: _Clock) -> tuple[list[int], bool]:
    """The batch holding the oldest sequence that scores the most sequences per second of model time.

    For each size k, the cheapest batch of k that holds the oldest is the window of k in length
    order that ends as low as it can: the k - 1 sequences just shorter than the oldest, or the k
    shortest when fewer are shorter. Among the sizes within the limits, the best ratio k / cost(k,
    longest) wins (ties: the larger batch, which clears more). Throughputs are compared by cross
    multiplication, in integers, as the C++ planner does.

    "Full" means waiting cannot help: the best size for this batch's length on this machine,
    within the limits, is reached already (on a CPU that is often 1: run at once; on a GPU it is
    large: wait for the delay, as length_aware does).
    """
    by_len = sorted(range(len(live)), key=lambda i: (live[i].length, i))
    pos = by_len.index(0)
    best_k, best_us, best_hi = 1, cost.batch_us(1, live[0].length), pos
    in_time = True
    for k in range(2, min(cfg.max_batch_size, len(live)) + 1):
        hi = max(pos, k - 1)
        longest = live[by_len[hi]].length
        if not _fits(k, longest, cfg):
            break  # k * longest only grows with k
        # The window of k holds the window of k - 1 (it grows down to 0, then up): the earliest
        # deadline only comes sooner with k, so the first k out of time ends the search.
        earliest = None
        if clock.us_per_token > 0:  # without a rate there is no cap: skip the O(k) scan
            for i in by_len[hi - k + 1:hi + 1]:
                earliest = _earliest(earliest, live[i].deadline_us)
        if not clock.in_time(k, longest, earliest):
            in_time = False
            break
        us = cost.batch_us(k, longest)
        if k * best_us >= best_k * us:
            best_k, best_us, best_hi = k, us, hi
    chosen = [live[i].id for i in by_len[best_hi - best_k + 1:best_hi + 1]]
    longest = live[by_len[best_hi]].length
    return chosen, not in_time or best_k >= _best_size(longest, cfg, cost)


def _best_size(length: int, cfg: PlannerConfig, cost: CostTable) -> int:
    """The batch size, within the limits, with the most sequences per second at `length`."""
    best_k, best_us = 1, cost.batch_us(1, length)
    for k in range(2, cfg.max_batch_size + 1):
        if not _fits(k, length, cfg):
            break
        us = cost.batch_us(k, length)
        if k * best_us >= best_k * us:
            best_k, best_us = k, us
    return best_k
