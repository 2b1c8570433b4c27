"""`rmscore up`, phase 1: one server at a time, the others idle.

For one server: a short closed-loop concurrency ramp (1, 2, 4, ... until doubling stops paying,
then back down the same levels; `sizing.ramp_points`) finds its capacity and the concurrency
where it is fastest (`sizing.fastest`); then `windows` repeated closed-loop windows at that
concurrency give each figure (throughput, p50, p99) as a mean with a 95% interval over the windows. Requests are one sequence each, lengths from the
RLHF lognormal mix: what a trainer's scoring calls look like, one pool shared by every server.
All through the one caller (`caller.async_client`) and the one load generator (`loadgen`).
"""

from __future__ import annotations

import asyncio
import math

from rmscore_tools import caller, loadgen
from rmscore_tools.up import sizing
from rmscore_tools.stats import mean_ci
from rmscore_tools.workload import LengthMix

# One sequence per request: the trainer's real load (docs/benchmark.md, `rmscore up`).
WORKLOAD = loadgen.Workload(mix=LengthMix(), chunk_size=1, rollout_size=1)
SEED = 0


def _point(r: dict) -> dict:
    return {"concurrency": r["concurrency"], "throughput": r["throughput_seq_s"],
            "p50_ms": r["latency_ms"]["p50"], "p99_ms": r["latency_ms"]["p99"], "errors": r["errors"],
            "error_kinds": r["error_kinds"]}


async def _level(client, requests: list, c: int, window_s: float, say, way: str) -> dict:
    r = await loadgen.closed_loop(client, requests, c, window_s, max_settle_s=30, drain_timeout_s=30)
    say(f"ramp {way} C={c}: {r['throughput_seq_s']:.1f} seq/s, p50 {r['latency_ms']['p50']:.0f} ms"
        + (f", {r['errors']} errors {r['error_kinds']}" if r["errors"] else ""))
    return _point(r)


async def _ramp(client, requests: list, max_concurrency: int, window_s: float, say) -> list[dict]:
    up: list[dict] = []
    for c in sizing.ramp_levels(max_concurrency):
        up.append(await _level(client, requests, c, window_s, say, "up"))
        if sizing.ramp_finished([p["throughput"] for p in up]):
            break
    # Back down the same levels, the top one first again: each level's second window, so a drift
    # over the ramp weighs on every level alike.
    down = [await _level(client, requests, p["concurrency"], window_s, say, "down") for p in reversed(up)]
    return sizing.ramp_points(up, down)


async def _windows(client, requests: list, concurrency: int, n: int, window_s: float, say) -> list[dict]:
    out = []
    for i in range(n):
        r = await loadgen.closed_loop(client, requests, concurrency, window_s, max_settle_s=30, drain_timeout_s=30)
        point = _point(r)
        point["latencies_ms"] = r["latencies_ms"]
        out.append(point)
        say(f"window {i + 1}/{n} at C={concurrency}: {r['throughput_seq_s']:.1f} seq/s")
    return out


async def _measure(transport: str, target: str, settings: dict, say) -> dict:
    requests = WORKLOAD.requests(SEED)
    client = caller.async_client(transport, target, chunk_size=1)
    try:
        await loadgen.warmup(client, requests, 2, settings["warmup_s"])
        ramp = await _ramp(client, requests, settings["max_concurrency"], settings["ramp_window_s"], say)
        concurrency, capacity = sizing.fastest([(p["concurrency"], p["throughput"]) for p in ramp])
        window_s = settings["window_s"] or sizing.window_seconds(capacity)
        windows = await _windows(client, requests, concurrency, settings["windows"], window_s, say)
    finally:
        await client.close()
    return {"ramp": ramp, "capacity_ramp_seq_s": capacity, "concurrency": concurrency, "window_s": window_s,
            "windows": windows}


def summarise(m: dict) -> dict:
    """The windows' figures as means with 95% intervals, plus every latency pooled (for the plots)."""
    w = m["windows"]
    return {
        "throughput": mean_ci([x["throughput"] for x in w]).as_dict(),
        "p50_ms": mean_ci([x["p50_ms"] for x in w]).as_dict(),
        "p99_ms": mean_ci([x["p99_ms"] for x in w]).as_dict(),
        "errors": sum(x["errors"] for x in w),
        "latencies_ms": [v for x in w for v in x["latencies_ms"]],
    }


def measure(transport: str, target: str, settings: dict, say) -> dict:
    """Ramp then windows against one running server; `settings`: warmup_s, max_concurrency,
    ramp_window_s, window_s (0: sized from the capacity), windows. `say(text)` reports progress."""
    m = asyncio.run(_measure(transport, target, settings, say))
    m.update(summarise(m))
    if not math.isfinite(m["throughput"]["mean"]) or m["throughput"]["mean"] <= 0:
        raise RuntimeError(f"no throughput measured: windows gave {[x['throughput'] for x in m['windows']]}")
    return m
