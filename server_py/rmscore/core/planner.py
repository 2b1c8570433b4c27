"""The batching policy as a pure function (docs/batching.md is its prose form).

Given the waiting sequences and the time now, `plan` says which sequences to
drop (deadline passed), and either which sequences form the next batch or how
long to wait before asking again. The C++ server implements the same function
(server_cpp/src/planner.cc) and both are held to contract/batching_vectors.json.

All times are integer microseconds so the two implementations agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

FIFO = "fifo"
LENGTH_AWARE = "length_aware"
MODES = (FIFO, LENGTH_AWARE)


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


def plan(queue: Sequence[Waiting], now_us: int, cfg: PlannerConfig) -> Decision:
    """`queue` is in arrival (queue) order; ids are unique."""
    decision = Decision()
    live = []
    for w in queue:
        if w.deadline_us is not None and w.deadline_us <= now_us:
            decision.expired.append(w.id)
        else:
            live.append(w)
    if not live:
        return decision

    if cfg.mode == FIFO:
        chosen, full = _fifo(live, cfg)
    else:
        chosen, full = _length_aware(live, cfg)

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


def _closed(live: list[Waiting], chosen: list[int], cfg: PlannerConfig) -> bool:
    """No sequence arriving later could join: the batch is at the size limit, or one more of even
    its current longest length would break the token budget. Waiting for the delay gains nothing."""
    ids = set(chosen)
    longest = max(w.length for w in live if w.id in ids)
    return not _fits(len(chosen) + 1, longest, cfg)


def _fifo(live: list[Waiting], cfg: PlannerConfig) -> tuple[list[int], bool]:
    """Arrival order, as many as the size and padded-token limits allow."""
    chosen = [live[0].id]
    longest = live[0].length
    for w in live[1:]:
        if not _fits(len(chosen) + 1, max(longest, w.length), cfg):
            return chosen, True
        chosen.append(w.id)
        longest = max(longest, w.length)
    return chosen, False


def _length_aware(live: list[Waiting], cfg: PlannerConfig) -> tuple[list[int], bool]:
    """Grow a window around the oldest sequence in length order.

    The oldest sequence is always in the batch, so nothing starves. Each step
    adds the neighbour (next shorter or next longer) that adds the least
    padding (ties: the shorter one); if it would break a limit, the other one is
    tried. The batch is "full" when neighbours remain but none fits.
    """
    by_len = sorted(range(len(live)), key=lambda i: (live[i].length, i))
    pos = by_len.index(0)  # index 0 of `live` is the oldest
    lo = hi = pos
    longest = live[0].length
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
            options.append((longest - live[left].length, 0, longest))
        if right is not None:
            options.append((count * (live[right].length - longest), 1, live[right].length))
        options.sort()  # least padding first; ties: shorter (0) first
        for _, side, new_longest in options:
            if _fits(count + 1, new_longest, cfg):
                break
        else:
            return [live[i].id for i in by_len[lo:hi + 1]], True
        if side == 0:
            lo -= 1
        else:
            hi += 1
            longest = new_longest
        count += 1
