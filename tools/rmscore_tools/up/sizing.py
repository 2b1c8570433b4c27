"""How much load `rmscore up` offers, sized from the machine and from each server's measured capacity.

Pure functions (no servers, no clock), so that the sizing is unit-tested on its own:

* `ramp_levels`, `ramp_finished`, `ramp_points`, `fastest`: the closed-loop concurrency ramp that
  finds a server's capacity quickly, and the concurrency it is then measured at: the one where it
  was fastest. The ramp goes up, then back down over the same levels, and each level's figure is
  the mean of its two windows: a one-window ramp on a 2-core machine swung by +-10 % from window
  to window, enough to draw a default that holds with load as one that loses, and a drift over
  the ramp (caches, the cost profile's online refresh) adds the same to every level both ways.
* `window_seconds`: one measurement window long enough for a useful p99 at that server's rate.
* `contended_offers`: phase 2's offered load. Every server gets `utilization` x its capacity
  divided by the number of servers (its share of a machine they all use at once), so the sum
  over servers of offered/capacity is `utilization` < 1 and no queue grows without bound. One
  rollout size for all (a trainer's makespans are only comparable for the same rollout), small
  enough that the slowest server still finishes several rollouts within the phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def ramp_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to max_concurrency (included even when not a power of two)."""
    if max_concurrency < 1:
        raise ValueError(f"max concurrency must be >= 1, got {max_concurrency}")
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    return levels + [max_concurrency]


def ramp_finished(throughputs: list[float], min_gain: float = 1.10) -> bool:
    """Stop the ramp once two doublings in a row gained less than `min_gain` x the best before
    them: the server is saturated and more in flight only queues. Two, not one, so that one
    noisy short window on a shared machine does not end the ramp early."""
    if len(throughputs) < 3:
        return False
    return not max(throughputs[-2:]) > min_gain * max(throughputs[:-2])


def ramp_points(up: list[dict], down: list[dict]) -> list[dict]:
    """One point per level of the upward pass: its throughput the mean of the level's windows on
    both passes (a level the downward pass lacks keeps its one window), both kept as `windows`;
    p50/p99 from the upward window, errors summed over both."""
    later = {p["concurrency"]: p for p in down}
    out = []
    for p in up:
        ws = [p["throughput"]] + ([later[p["concurrency"]]["throughput"]] if p["concurrency"] in later else [])
        finite = [w for w in ws if math.isfinite(w)]
        errors = p.get("errors", 0) + later.get(p["concurrency"], {}).get("errors", 0)
        out.append({**p, "windows": ws, "errors": errors,
                    "throughput": sum(finite) / len(finite) if finite else float("nan")})
    return out


def fastest(points: list[tuple[int, float]]) -> tuple[int, float]:
    """(concurrency, capacity): the level with the best throughput (the lowest such level on a tie)."""
    usable = [(c, t) for c, t in points if math.isfinite(t) and t > 0]
    if not usable:
        raise ValueError(f"no ramp level produced a throughput: {points}")
    capacity = max(t for _, t in usable)
    return min(c for c, t in usable if t == capacity), capacity


def window_seconds(capacity_seq_s: float, target_requests: int = 100, lo: float = 2.0, hi: float = 4.0) -> float:
    """A window that holds about `target_requests` one-sequence answers, within [lo, hi] seconds."""
    if not capacity_seq_s > 0:
        raise ValueError(f"capacity must be > 0 seq/s, got {capacity_seq_s}")
    return min(hi, max(lo, target_requests / capacity_seq_s))


@dataclass(frozen=True)
class Offer:
    """Phase 2's load on one server: one trainer rank starting a rollout every `period_s`."""

    kind: str
    capacity_seq_s: float
    rate_seq_s: float
    rollout_size: int
    period_s: float

    @property
    def utilization(self) -> float:
        """Offered load over the server's capacity alone."""
        return self.rate_seq_s / self.capacity_seq_s


def contended_offers(capacities: dict[str, float], duration_s: float, utilization: float = 0.5,
                     min_rollouts: int = 6, min_size: int = 4, max_size: int = 64) -> dict[str, Offer]:
    """Per server: offered rate = utilization x capacity / servers; see the module docstring."""
    if not 0 < utilization < 1:
        raise ValueError(f"utilization must be in (0, 1) so that queues stay bounded, got {utilization}")
    bad = {k: c for k, c in capacities.items() if not (math.isfinite(c) and c > 0)}
    if bad:
        raise ValueError(f"capacities must be finite and > 0 seq/s, got {bad}")
    if not capacities:
        raise ValueError("no server has a measured capacity")
    n = len(capacities)
    rates = {k: utilization * c / n for k, c in capacities.items()}
    # The slowest server must still start `min_rollouts` rollouts within the phase.
    size = int(min(rates.values()) * duration_s / min_rollouts)
    size = max(min_size, min(max_size, size))
    return {k: Offer(k, capacities[k], rates[k], size, size / rates[k]) for k in capacities}
