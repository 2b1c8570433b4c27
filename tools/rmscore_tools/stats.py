"""Statistics of repeated independent runs: mean with a t confidence interval, and the overlap test.

The study's test: two configurations differ on a figure when the 95% confidence
intervals of their means (over K independent repetitions, Student's t with
K-1 degrees of freedom) do not overlap. Non-overlap is a conservative test
(it implies a difference at roughly p < 0.01 for equal variances); overlap
does not prove equality, so the verdict says "overlap", never "equal".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True)
class CI:
    mean: float
    lo: float
    hi: float
    half_width: float
    sd: float
    n: int
    confidence: float = 0.95

    def as_dict(self) -> dict:
        return asdict(self)

    def fmt(self, digits: int = 3) -> str:
        """`mean ± half` with `digits` significant digits of the mean."""
        if self.n == 0 or not math.isfinite(self.mean):
            return "n/a"
        if not math.isfinite(self.half_width):
            return f"{_sig(self.mean, digits)} (n={self.n}, no CI)"
        return f"{_sig(self.mean, digits)} ± {_sig(self.half_width, 2)}"


def _sig(x: float, digits: int) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def t_quantile(confidence: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, df))


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> CI:
    """Mean and two-sided `confidence` interval from the t distribution (df = n-1).

    NaN values (a repetition that could not produce the figure) are dropped.
    With one value the interval is undefined (infinite half-width).
    """
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = len(x)
    if n == 0:
        nan = float("nan")
        return CI(nan, nan, nan, nan, nan, 0, confidence)
    mean = float(x.mean())
    if n == 1:
        inf = float("inf")
        return CI(mean, -inf, inf, inf, float("nan"), 1, confidence)
    sd = float(x.std(ddof=1))
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return CI(mean, mean - half, mean + half, half, sd, n, confidence)


def overlaps(a: CI, b: CI) -> bool:
    """Closed intervals [lo, hi] share a point. Undefined intervals count as overlapping."""
    if a.n < 2 or b.n < 2:
        return True
    return a.lo <= b.hi and b.lo <= a.hi


def verdict(a: CI, b: CI, higher_is_better: bool) -> str:
    """'overlap', 'A' (a is better, intervals separated) or 'B'."""
    if a.n == 0 or b.n == 0:
        return "n/a"
    if overlaps(a, b):
        return "overlap"
    a_higher = a.mean > b.mean
    return "A" if a_higher == higher_is_better else "B"


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """Linear-interpolated percentiles (numpy's default), keyed 'p50' etc.; NaN when empty."""
    if len(values) == 0:
        return {f"p{q:g}": float("nan") for q in qs}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{q:g}": float(np.percentile(arr, q)) for q in qs}
