"""Two arms of one server kind that differ only in the server's environment (an allocator setting, say),
side by side: both servers up at once on one cost table, rounds alternating which arm goes first, each
round one in flight (seq/s, p50 ms) then 64 in flight (seq/s), with the server's CPU ms per request
(utime + stime from /proc). Prints each round and, at the end, arm B / arm A per figure with its 95%
interval over the rounds.

    python -m rmscore_tools.bench.ab_env --kind py-grpc-onnxruntime --rounds 5 \\
        --a PYTHONMALLOC=pymalloc --b PYTHONMALLOC=malloc

An empty arm (no --a) is the server's environment as this process has it."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

from rmscore_tools import caller, launch
from rmscore_tools.bench import scheduling
from rmscore_tools.host import machine_info
from rmscore_tools.observe import cpu_s
from rmscore_tools.stats import mean_ci
from rmscore_tools.workload import LengthMix

FIGURES = ("c1", "p50", "cpu1", "c64", "cpu64")


async def closed_loop(kind: str, server, lens: np.ndarray, conc: int, secs: float) -> tuple[float, float, float]:
    """`conc` callers, one sequence per call, lengths from `lens`, for `secs`: seq/s, p50 ms, server CPU ms/call."""
    c = caller.async_client(launch.transport(kind), caller.target_of(server), chunk_size=1, timeout_s=60)
    n, lat = [0], []
    try:
        await c.score_ids([[101, 2000, 102]])
        stop = time.monotonic() + secs

        async def one(k: int) -> None:
            i = k
            while time.monotonic() < stop:
                L = int(lens[i % len(lens)])
                i += conc
                t = time.perf_counter()
                await c.score_ids([[101] + [2000 + j % 500 for j in range(L - 2)] + [102]])
                lat.append(time.perf_counter() - t)
                n[0] += 1
        c0, t0 = cpu_s(server.proc.pid), time.monotonic()
        await asyncio.gather(*[one(k) for k in range(conc)])
        el, c1 = time.monotonic() - t0, cpu_s(server.proc.pid)
    finally:
        await c.close()
    return n[0] / el, statistics.median(lat) * 1e3, (c1 - c0) / n[0] * 1e3


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pairs)


def run(kind: str, rounds: int, arms: dict[str, dict[str, str]], c1_s: float = 5, c64_s: float = 6,
        log=print) -> dict[str, dict[str, list[float]]]:
    tmp = pathlib.Path(tempfile.mkdtemp())
    first = launch.start(kind, cost_profile_dir=str(tmp / "cache"))  # one measured table for both arms
    first.stop()
    [table] = (tmp / "cache").glob("*.json")
    servers = {a: launch.start(kind, cost_profile=str(table), env=e, log_dir=str(tmp / a)) for a, e in arms.items()}
    lens = LengthMix.parse(scheduling.LENGTHS).sample(np.random.default_rng(3), 100000)
    res = {a: {k: [] for k in FIGURES} for a in arms}
    try:
        for r in range(rounds):
            for a in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                t1, p50, cpu1 = asyncio.run(closed_loop(kind, servers[a], lens, 1, c1_s))
                t64, _, cpu64 = asyncio.run(closed_loop(kind, servers[a], lens, 64, c64_s))
                for k, v in zip(FIGURES, (t1, p50, cpu1, t64, cpu64)):
                    res[a][k].append(v)
                log(f"{r} {a}: c1 {t1:.1f} seq/s p50 {p50:.2f} ms cpu {cpu1:.2f} ms/req | "
                    f"c64 {t64:.1f} seq/s cpu {cpu64:.2f} ms/req")
    finally:
        for s in servers.values():
            s.stop()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", default="py-http-onnxruntime")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--a", action="append", default=[], metavar="NAME=VALUE", help="arm A's server environment")
    ap.add_argument("--b", action="append", default=[], metavar="NAME=VALUE", help="arm B's server environment")
    args = ap.parse_args(argv)
    arms = {"A": _env(args.a), "B": _env(args.b)}
    print(f"{args.kind}: A {arms['A'] or 'as is'}, B {arms['B'] or 'as is'}; CPU {machine_info()['cpu']}", flush=True)
    res = run(args.kind, args.rounds, arms, log=lambda s: print(s, flush=True))
    for k in FIGURES:
        ratios = [b / a for b, a in zip(res["B"][k], res["A"][k])]
        print(f"{args.kind} {k}: A {statistics.mean(res['A'][k]):.2f} B {statistics.mean(res['B'][k]):.2f}  "
              f"B/A {mean_ci(ratios).fmt()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
