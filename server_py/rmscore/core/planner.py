"""The batching policy as a pure function (docs/batching.md is its prose form).

Given the waiting sequences and the time now, `plan` says which sequences to
drop (deadline passed), and either which sequences form the next batch or how
long to wait before asking again. The C++ server implements the same function
(server_cpp/src/planner.cc) and both are held to contract/batching_vectors.json.

All times are integer microseconds so the two implementations agree exactly.
The `cost_aware` mode takes the machine's cost table (cost.py) as a further input.

Every mode waits for the delay only when a partner can be expected: with `arrivals_per_s` (the
batcher's measured arrival rate, ArrivalRate; 0: unknown) a batch that is neither full nor due runs
at once when fewer than one sequence is expected to arrive before the delay ends. At one request in
flight nothing else arrives, and waiting out the delay for a partner that cannot come cost every
request 2 ms (a tenth of its time here) whenever the cost table said a batch of two would be cheaper
per sequence; under a GPU's load, where thousands arrive a second, the wait still fills the batch.

Every mode also keeps a batch inside its members' deadlines: with `us_per_token` (the admission's
measured model microseconds per token, admission.py; 0: unknown) a batch grows only while its
padded tokens times that rate end before the earliest deadline among its members. The oldest
sequence still runs, alone if need be. Without it a 4-token request with a 2 s deadline, batched
with fifteen 512-token ones, waited out its deadline inside a 4 s batch (docs/hardening.md).

By the same rate, a batch grows only while it is expected to take at most `max_batch_us` (0: no
bound). A batch holds the model, and on a CPU every thread, until it ends, and each caller's next
turn comes after the batches running: 16 x 512 tokens took 3.6 s on a 2-core CPU, so a caller with
a 2 s deadline could only be refused while a flood kept such batches coming (issue 29). On a CPU the
time per token hardly falls past a few sequences, so the bound costs no throughput there; on a GPU
a batch of the same tokens takes a fraction of it, and the bound rarely binds.
"""

from __future__ import annotations

import bisect
import math
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
    max_batch_us: int = 0  # a batch grows only while its expected time stays within it (0: no bound)


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


class QueueIndex:
    """The live waiting sequences in the orders the planner searches, kept as they change: queue order
    (a sorted list of (rank, id)), length (a sorted list of (length, rank, id): equal lengths keep the
    queue order) and deadline (a sorted list of (deadline_us, id), as C++'s set).

    The rank is the queue order: the batcher gives each sequence its caller's turn (batcher.py, "fair
    order"), so a new caller's sequence may rank before sequences that arrived earlier; equal ranks
    keep their ids' order. The oldest sequence, which every batch holds, is the lowest rank.

    The batcher keeps one beside its queue (add on submit, remove when a sequence leaves), so a
    decision reads O(max_batch_size) entries and binary searches whatever is queued: rebuilding and
    sorting the waiting list under the lock at every wake-up cost 8.7 ms at 4,096 queued, paid per
    sequence when the planner picks batches of one. `plan` builds one from a list (the reference
    the shared vectors hold both languages to). Not thread-safe: the batcher's lock guards it."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Waiting, int]] = {}  # id -> (waiting, rank)
        self._by_rank: list[tuple[int, int]] = []  # (rank, id), sorted: the queue order
        self._rank_lengths: list[int] = []  # the length of each entry of _by_rank, at the same place
        self.by_length: list[tuple[int, int, int]] = []
        self._deadlines: list[tuple[int, int]] = []  # (deadline_us, id) of the sequences that have one

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, w: Waiting, rank: int) -> None:
        """`rank`: the sequence's place in the queue order (ties: by id)."""
        self._by_id[w.id] = (w, rank)
        at = bisect.bisect_left(self._by_rank, (rank, w.id))
        self._by_rank.insert(at, (rank, w.id))
        self._rank_lengths.insert(at, w.length)
        bisect.insort(self.by_length, (w.length, rank, w.id))
        if w.deadline_us is not None:
            bisect.insort(self._deadlines, (w.deadline_us, w.id))

    def remove(self, seq_id: int) -> Waiting | None:
        got = self._by_id.pop(seq_id, None)
        if got is None:
            return None
        w, rank = got
        at = bisect.bisect_left(self._by_rank, (rank, seq_id))
        del self._by_rank[at]
        del self._rank_lengths[at]
        del self.by_length[bisect.bisect_left(self.by_length, (w.length, rank, seq_id))]
        if w.deadline_us is not None:
            del self._deadlines[bisect.bisect_left(self._deadlines, (w.deadline_us, seq_id))]
        return w

    def get(self, seq_id: int) -> Waiting:
        return self._by_id[seq_id][0]

    def oldest(self) -> Waiting:
        """The first in queue order (the lowest rank)."""
        return self._by_id[self._by_rank[0][1]][0]

    def first_rank(self) -> int:
        """The lowest rank queued (the index must not be empty)."""
        return self._by_rank[0][0]

    def tokens_through(self, rank: int) -> int:
        """Real tokens of the sequences ranked at or before `rank`: what runs before a sequence added now
        at `rank` (equal ranks keep their ids' order, and a new id is the highest). Summed in C over a
        slice, so admission at 4,096 queued costs microseconds."""
        return sum(self._rank_lengths[:bisect.bisect_right(self._by_rank, (rank, float("inf")))])

    def in_arrival(self):
        """In queue order."""
        return (self._by_id[seq_id][0] for _, seq_id in self._by_rank)

    def position(self, w: Waiting) -> int:
        """Where `w` sits in `by_length`."""
        return bisect.bisect_left(self.by_length, (w.length, self._by_id[w.id][1], w.id))

    def rank(self, seq_id: int) -> int:
        return self._by_id[seq_id][1]

    def expired(self, now_us: int) -> list[int]:
        """Ids whose deadline is at or before `now_us`, soonest first (ties: id); they stay until removed."""
        end = bisect.bisect_right(self._deadlines, (now_us, float("inf")))
        return [seq_id for _, seq_id in self._deadlines[:end]]


def plan(queue: Sequence[Waiting], now_us: int, cfg: PlannerConfig, cost: CostTable | None = None,
         us_per_token: float = 0.0, arrivals_per_s: float = 0.0) -> Decision:
    """`queue` is in arrival (queue) order; ids are unique. `cost` is required by `cost_aware`;
    `us_per_token` > 0 keeps each batch inside its members' deadlines, `arrivals_per_s` > 0 waits for
    the delay only when a partner is expected (module docstring). The reference form: it indexes the
    live sequences and asks `plan_live`, as the batcher does with the index it keeps."""
    decision = Decision()
    index = QueueIndex()
    for rank, w in enumerate(queue):
        if w.deadline_us is not None and w.deadline_us <= now_us:
            decision.expired.append(w.id)
        else:
            index.add(w, rank)
    live = plan_live(index, now_us, cfg, cost, us_per_token, arrivals_per_s)
    decision.batch, decision.wait_us = live.batch, live.wait_us
    return decision


def plan_live(index: QueueIndex, now_us: int, cfg: PlannerConfig, cost: CostTable | None = None,
              us_per_token: float = 0.0, arrivals_per_s: float = 0.0) -> Decision:
    """`plan` over an index of live sequences (none expired at `now_us`: the caller removed them)."""
    decision = Decision()
    if not len(index):
        return decision
    clock = _Clock(now_us, us_per_token, cfg.max_batch_us)
    if cfg.mode == FIFO:
        chosen, full = _fifo(index, cfg, clock)
    elif cfg.mode == COST_AWARE:
        if cost is None:
            raise ValueError("the cost_aware planner needs a cost table")
        chosen, full = _cost_aware(index, cfg, cost, clock)
    else:
        chosen, full = _length_aware(index, cfg, clock)

    oldest = index.oldest()
    due_us = oldest.arrival_us + cfg.max_queue_delay_us
    if full or _closed(chosen, cfg) or now_us >= due_us or _alone(arrivals_per_s, due_us - now_us):
        decision.batch = [w.id for w in sorted(chosen, key=lambda w: (index.rank(w.id), w.id))]
    else:
        decision.wait_us = due_us - now_us
    return decision


def _alone(arrivals_per_s: float, wait_us: int) -> bool:
    """Fewer than one sequence is expected to arrive in `wait_us` at the measured rate (0: unknown,
    never alone). C++ computes the same double product (planner.cc)."""
    return arrivals_per_s > 0 and arrivals_per_s * float(wait_us) < 1e6


class ArrivalRate:
    """Sequences arriving per second, from the arrivals of the last few TAU_US: each arrival counts
    exp(-age / TAU_US) / TAU_US, so a steady rate reads as itself, an idle spell decays towards 0 and
    a burst shows within a batch's time. The batcher keeps one (under its lock) and hands `per_s` to
    the planner; server_cpp/src/planner.h ArrivalRate is the same."""

    TAU_US = 200_000

    def __init__(self) -> None:
        self._rate = 0.0  # per second, as of _at_us
        self._at_us: int | None = None

    def add(self, count: int, now_us: int) -> None:
        self._rate = self.per_s(now_us) + count * 1e6 / self.TAU_US
        self._at_us = now_us

    def per_s(self, now_us: int) -> float:
        if self._at_us is None:
            return 0.0
        return self._rate * math.exp(-max(0, now_us - self._at_us) / self.TAU_US)


def _fits(count: int, longest: int, cfg: PlannerConfig) -> bool:
    return count <= cfg.max_batch_size and count * longest <= cfg.max_batch_tokens


@dataclass(frozen=True)
class _Clock:
    now_us: int
    us_per_token: float
    max_batch_us: int = 0

    def in_time(self, count: int, longest: int, deadline_us: int | None) -> bool:
        """A batch of `count` padded to `longest` takes at most `max_batch_us` and ends before
        `deadline_us` (the earliest of its members'), by the measured rate; always true when the rate
        is unknown, each bound only when it is set. C++ computes the same double products
        (planner.cc), so both compare alike."""
        if self.us_per_token <= 0:
            return True
        run_us = float(count * longest) * self.us_per_token
        if self.max_batch_us > 0 and run_us > float(self.max_batch_us):
            return False
        return deadline_us is None or run_us <= float(deadline_us - self.now_us)


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _closed(chosen: list[Waiting], cfg: PlannerConfig) -> bool:
    """No sequence arriving later could join: the batch is at the size limit, or one more of even
    its current longest length would break the token budget. Waiting for the delay gains nothing."""
    return not _fits(len(chosen) + 1, max(w.length for w in chosen), cfg)


def _fifo(index: QueueIndex, cfg: PlannerConfig, clock: _Clock) -> tuple[list[Waiting], bool]:
    """Arrival order, as many as the size, padded-token and deadline limits allow."""
    arrivals = index.in_arrival()
    first = next(arrivals)
    chosen = [first]
    longest, earliest = first.length, first.deadline_us
    for w in arrivals:
        n, by = max(longest, w.length), _earliest(earliest, w.deadline_us)
        if not (_fits(len(chosen) + 1, n, cfg) and clock.in_time(len(chosen) + 1, n, by)):
            return chosen, True
        chosen.append(w)
        longest, earliest = n, by
    return chosen, False


def _length_aware(index: QueueIndex, cfg: PlannerConfig, clock: _Clock) -> tuple[list[Waiting], bool]:
    """Grow a window around the oldest sequence in length order.

    The oldest sequence is always in the batch, so nothing starves. Each step
    adds the neighbour (next shorter or next longer) that adds the least
    padding (ties: the shorter one); if it would break a limit, the other one is
    tried. The batch is "full" when neighbours remain but none fits.
    """
    by_len = index.by_length
    oldest = index.oldest()
    lo = hi = index.position(oldest)
    longest, earliest = oldest.length, oldest.deadline_us
    count = 1

    def window() -> list[Waiting]:
        return [index.get(e[2]) for e in by_len[lo:hi + 1]]

    while True:
        left = index.get(by_len[lo - 1][2]) if lo > 0 else None
        right = index.get(by_len[hi + 1][2]) if hi + 1 < len(by_len) else None
        if left is None and right is None:
            return window(), False
        # Padding each choice adds: a shorter one pads itself up to `longest`;
        # a longer one pads every sequence already chosen up to its length.
        options = []
        if left is not None:
            options.append((longest - left.length, 0, longest, left.deadline_us))
        if right is not None:
            options.append((count * (right.length - longest), 1, right.length, right.deadline_us))
        options.sort(key=lambda o: o[:2])  # least padding first; ties: shorter (0) first
        for _, side, new_longest, deadline in options:
            by = _earliest(earliest, deadline)
            if _fits(count + 1, new_longest, cfg) and clock.in_time(count + 1, new_longest, by):
                break
        else:
            return window(), True
        if side == 0:
            lo -= 1
        else:
            hi += 1
            longest = new_longest
        earliest = by
        count += 1


def _cost_aware(index: QueueIndex, cfg: PlannerConfig, cost: CostTable, clock: _Clock) -> tuple[list[Waiting], bool]:
    """The batch holding the oldest sequence that does the most work per second of model time.

    For each size k, the cheapest batch of k that holds the oldest is the window of k in length
    order that ends as low as it can: the k - 1 sequences just shorter than the oldest, or the k
    shortest when fewer are shorter. Among the sizes within the limits, the best ratio worth(window) /
    cost(k, longest) wins, a window's worth being what its sequences would cost in the best batches of
    their own lengths (_worth): padding counts as the waste it is. Ties go to the smaller batch: the
    same model time per sequence, answered sooner, and the other workers not left idle behind one
    long batch. The warm-up extrapolates the sizes its budget left linearly, so they tie with the
    largest size it measured; with ties to the larger batch cpp-grpc ran batches of 17 to 32 on one
    thread, and a rollout's makespan fell 1.37 -> 1.21 x the ideal when ties went the other way
    (docs/batching.md). Throughputs are compared by cross
    multiplication, in integers, as the C++ planner does.

    "Full" means waiting cannot help: the best size for this batch's length on this machine,
    within the limits, is reached already (on a CPU that is often 1: run at once; on a GPU it is
    large: wait for the delay, as length_aware does).
    """
    by_len = index.by_length
    oldest = index.oldest()
    pos = index.position(oldest)
    queued = len(by_len)
    best_value = value = _worth(oldest.length, queued, cfg, cost)
    best_us, best_k, best_hi = cost.batch_us(1, oldest.length), 1, pos
    in_time = True
    # The window of k holds the window of k - 1 and one more: it grows down to 0, then up. So its
    # earliest deadline is kept as it grows (O(1) a step), and only comes sooner with k: the first k
    # out of time ends the search.
    earliest = oldest.deadline_us
    for k in range(2, min(cfg.max_batch_size, len(by_len)) + 1):
        hi = max(pos, k - 1)
        longest = by_len[hi][0]
        if not _fits(k, longest, cfg):
            break  # k * longest only grows with k
        joined = by_len[pos - k + 1] if k - 1 <= pos else by_len[hi]
        earliest = _earliest(earliest, index.get(joined[2]).deadline_us)
        if not clock.in_time(k, longest, earliest):
            in_time = False
            break
        value += _worth(joined[0], queued, cfg, cost)
        us = cost.batch_us(k, longest)
        if value * best_us > best_value * us:
            best_value, best_us, best_k, best_hi = value, us, k, hi
    chosen = [index.get(e[2]) for e in by_len[best_hi - best_k + 1:best_hi + 1]]
    return chosen, not in_time or best_k >= _best_size(by_len[best_hi][0], cfg, cost)


#: _worth's unit: 1/WORTH_SCALE of a microsecond, so a sequence's share of its best batch (a division)
#: stays an integer the C++ planner computes alike.
WORTH_SCALE = 1024


def _worth(length: int, queued: int, cfg: PlannerConfig, cost: CostTable) -> int:
    """What scoring one sequence of `length` is worth: its share of the model time of the best batch of
    its own length (the least model time per sequence this machine has for it), that batch no larger
    than what is `queued`, in 1/WORTH_SCALE us. A batch's worth is its sequences' sum, so a short
    sequence padded into a long batch counts for what it would cost among its own length, not as a
    whole sequence: counting sequences, a batch of 8 on a CPU looked as good as 8 batches of 1 whatever
    its padding, and the Python core without a refined table ran batches of 4 to 8 with 7.5-16%
    padding at 64 in flight (docs/batching.md). Capped by the queue because a batch of its own length
    that the queue cannot fill is no alternative: on a GPU, 3 sequences queued still run together.
    Memoized as _best_size is."""
    k = min(_best_size(length, cfg, cost), queued)
    key = ("worth", length, k)
    found = cost.memo.get(key)
    if found is None:
        found = cost.memo[key] = cost.batch_us(k, length) * WORTH_SCALE // k
    return found


def _best_size(length: int, cfg: PlannerConfig, cost: CostTable) -> int:
    """The batch size, within the limits, with the most sequences per second at `length`. Kept in the
    table's memo: it asks batch_us for every size, and the answer changes only with the table (which
    every batch not run alone replaces) and the limits. A decision at 4,096 queued took 29 us with it
    and 43 us without (rmscore bench --planning, same table throughout)."""
    key = ("best_size", length, cfg.max_batch_size, cfg.max_batch_tokens)
    found = cost.memo.get(key)
    if found is None:
        found = cost.memo[key] = _best_size_of(length, cfg, cost)
    return found


def _best_size_of(length: int, cfg: PlannerConfig, cost: CostTable) -> int:
    best_k, best_us = 1, cost.batch_us(1, length)
    for k in range(2, cfg.max_batch_size + 1):
        if not _fits(k, length, cfg):
            break
        us = cost.batch_us(k, length)
        if k * best_us > best_k * us:
            best_k, best_us = k, us
    return best_k
