"""What a batch costs on this machine: the cost model the `cost_aware` planner optimises.

A `CostTable` holds the model time, in integer microseconds, of a batch of B sequences padded to
L tokens at the points of a grid (batch sizes x lengths). Between grid points it interpolates
linearly, over L first and then over B; past the last point it extrapolates in proportion; below
the first it takes the first point. The table is made non-decreasing along both axes when it is
built: a bigger batch never costs less, and that keeps every difference the interpolation takes
non-negative, so the integer arithmetic gives the same values in C++ (server_cpp/src/cost.cc,
where division truncates and Python's floors: on non-negative numbers they agree).
contract/batching_vectors.json holds both implementations to the same values.

`CostModel` is the live form a server keeps: the table it measured at warm-up (or loaded from a
profile, cost_profile.py), refined by every batch the server runs, so the planner follows the
machine as it drifts (other processes, thermal limits).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence


class CostError(ValueError):
    pass


def _nondecreasing(values: list[int]) -> list[int]:
    out, top = [], 0
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


@dataclass(frozen=True)
class CostTable:
    batch_sizes: tuple[int, ...]
    lengths: tuple[int, ...]
    cost_us: tuple[tuple[int, ...], ...]  # [batch index][length index]
    #: Answers that depend on this table alone, kept by who asks (the planner's best size per length):
    #: a table is never changed, a refined one is a new table with an empty memo.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @staticmethod
    def make(batch_sizes: Sequence[int], lengths: Sequence[int], cost_us: Sequence[Sequence[int]]) -> "CostTable":
        """Validates the grid (quoting what is wrong) and makes the costs non-decreasing in B and L."""
        for name, axis in (("batch_sizes", batch_sizes), ("lengths", lengths)):
            if not axis or any(int(v) < 1 for v in axis) or any(b <= a for a, b in zip(axis, axis[1:])):
                raise CostError(f"cost table {name} must be ascending integers >= 1, got {list(axis)!r}")
        if len(cost_us) != len(batch_sizes) or any(len(row) != len(lengths) for row in cost_us):
            raise CostError(f"cost table cost_us must be {len(batch_sizes)} rows of {len(lengths)} values, "
                            f"got {[len(r) for r in cost_us]!r} row lengths")
        rows = [[int(v) for v in row] for row in cost_us]
        if any(v < 1 for row in rows for v in row):
            raise CostError(f"cost table cost_us must be integers >= 1 microsecond, got {rows!r}")
        rows = [_nondecreasing(row) for row in rows]  # along L
        cols = [_nondecreasing([rows[i][j] for i in range(len(rows))]) for j in range(len(lengths))]  # along B
        rows = [[cols[j][i] for j in range(len(lengths))] for i in range(len(rows))]
        return CostTable(tuple(int(b) for b in batch_sizes), tuple(int(n) for n in lengths),
                         tuple(tuple(r) for r in rows))

    def batch_us(self, count: int, length: int) -> int:
        """Model microseconds of `count` sequences padded to `length` tokens (both >= 1): linear between
        grid points, the first point's value below them, proportional past the last; over L first, then
        over B. Written out: the planner asks this for every size it weighs, and nested closures were
        most of a decision's time."""
        ls, bs = self.lengths, self.batch_sizes
        if length <= ls[0]:
            j, num, den = 0, 0, 1
        elif length >= ls[-1]:
            j, num, den = -1, length, ls[-1]
        else:
            j = bisect.bisect_right(ls, length) - 1
            num, den = length - ls[j], ls[j + 1] - ls[j]

        def at(row: tuple[int, ...]) -> int:  # the row's value at `length`
            if j == -1:
                return row[-1] * num // den
            # num 0 (at or below a grid point): row[j + 1] may not exist
            return row[j] + (row[j + 1] - row[j]) * num // den if num else row[j]

        c = self.cost_us
        if count <= bs[0]:
            return at(c[0])
        if count >= bs[-1]:
            return at(c[-1]) * count // bs[-1]
        i = bisect.bisect_right(bs, count) - 1
        lo, hi = at(c[i]), at(c[i + 1])
        return lo + (hi - lo) * (count - bs[i]) // (bs[i + 1] - bs[i])

    def to_json(self) -> dict:
        return {"batch_sizes": list(self.batch_sizes), "lengths": list(self.lengths),
                "cost_us": [list(r) for r in self.cost_us]}

    @staticmethod
    def from_json(doc: dict) -> "CostTable":
        try:
            return CostTable.make(doc["batch_sizes"], doc["lengths"], doc["cost_us"])
        except (KeyError, TypeError) as e:
            raise CostError(f"cost table needs batch_sizes, lengths and cost_us: {e!r}") from None


class CostModel:
    """The table a server plans with, refined online. Not thread-safe: the batcher holds its lock
    around `table` and `observe`."""

    #: Weight of one observed batch in its grid cell: about the last 10 batches of that shape count.
    ALPHA = 0.1

    def __init__(self, table: CostTable):
        self._table = table
        self._cells = [list(map(float, row)) for row in table.cost_us]
        self.observed = 0

    @property
    def table(self) -> CostTable:
        return self._table

    def observe(self, count: int, length: int, seconds: float) -> None:
        """One batch of `count` sequences padded to `length` took `seconds`. Its nearest grid cell
        moves toward it, the observation scaled by the table's own ratio between the two shapes (so a
        batch of 6 refines the cell of 8 without being read as a batch of 8)."""
        t = self._table
        i = min(range(len(t.batch_sizes)), key=lambda k: abs(t.batch_sizes[k] - count))
        j = min(range(len(t.lengths)), key=lambda k: abs(t.lengths[k] - length))
        predicted = t.batch_us(count, length)
        at_cell = seconds * 1e6 * t.cost_us[i][j] / max(1, predicted)
        self._cells[i][j] += self.ALPHA * (at_cell - self._cells[i][j])
        self._table = CostTable.make(t.batch_sizes, t.lengths,
                                     [[max(1, round(v)) for v in row] for row in self._cells])
        self.observed += 1


def grid(max_batch_size: int, max_length: int) -> tuple[list[int], list[int]]:
    """The warm-up grid: powers of two up to the limits (the limits themselves included)."""
    def axis(limit: int, start: int) -> list[int]:
        out, v = [], start
        while v < limit:
            out.append(v)
            v *= 2
        return out + [limit]
    return axis(max_batch_size, 1), axis(max_length, 16) if max_length > 16 else [max_length]
