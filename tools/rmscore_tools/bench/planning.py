"""`rmscore bench --planning`: how long one batching decision takes with many sequences queued.

Two forms, in both languages, per batching mode: the queue rebuilt as a list and planned (what both
batchers did at every wake-up until they kept an index: `plan` / `Plan`) and the index each batcher
now keeps beside its queue (`QueueIndex.expired` + `plan_live`; C++ `Expired` + `PlanLive`). The
C++ side is build/cpp/rmscore-planner-timing (server_cpp/bench/planner_timing.cc), fed the same
queue shape: lengths uniform in 16..512, half with a far deadline, the shared CPU-like cost table,
32 x 8192 limits. Each figure is the best of REPEATS rounds, microseconds per decision. Writes
OUT/planning.json and OUT/planning.md.
"""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import time

from rmscore.core.cost import CostTable, grid
from rmscore.core.planner import COST_AWARE, FIFO, LENGTH_AWARE, PlannerConfig, QueueIndex, Waiting, plan, plan_live
from rmscore_tools import launch

TIMING = launch.ROOT / "build" / "cpp" / "rmscore-planner-timing"
MODES = (COST_AWARE, LENGTH_AWARE, FIFO)


def _cpu_like_table() -> CostTable:
    # contract/make_batching_vectors.py's CPU_TABLE on the grid the C++ timing uses.
    sizes, lengths = grid(32, 512)
    return CostTable.make(sizes, lengths, [[300 + 12 * b * n * (4 + b) // 4 for n in lengths] for b in sizes])


def _best_us(repeats: int, n: int, f) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def python_timing(queued: int, repeats: int) -> dict:
    rng = random.Random(0)
    now, far = 1_000_000, 1_000_000_000
    table = _cpu_like_table()
    # As the batcher held it: a dict by sequence id, turned into Waiting objects at every wake-up.
    queue = {i + 1: (i, 16 + rng.randrange(497), far if i % 2 == 0 else None) for i in range(queued)}
    index = QueueIndex()
    for seq_id, (arrival, length, deadline) in queue.items():
        index.add(Waiting(seq_id, arrival, length, deadline), seq_id)
    out = {}
    for mode in MODES:
        cfg = PlannerConfig(32, 8192, 2000, mode)

        def rebuilt() -> None:
            plan([Waiting(i, a, n, d) for i, (a, n, d) in queue.items()], now, cfg, table, 3.0)

        def kept() -> None:
            index.expired(now)
            plan_live(index, now, cfg, table, 3.0)

        out[mode] = {"rebuilt_us": _best_us(repeats, 5, rebuilt), "index_us": _best_us(repeats, 500, kept)}
    return out


def cpp_timing(queued: int, repeats: int) -> dict | None:
    if not TIMING.exists():
        return None
    done = subprocess.run([str(TIMING), str(queued), str(repeats)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def markdown(rec: dict) -> str:
    lines = [f"# One batching decision with {rec['queued']} sequences queued ({rec['when']}, {rec['cpu']})", "",
             f"Microseconds per decision, best of {rec['repeats']} rounds: the queue rebuilt and sorted at every "
             "wake-up, against the index each batcher keeps (planner.QueueIndex, planner.h QueueIndex).", "",
             "| language | mode | rebuilt list (us) | kept index (us) | ratio |", "|---|---|---:|---:|---:|"]
    for lang in ("python", "cpp"):
        for mode, t in (rec.get(lang) or {}).items():
            lines.append(f"| {lang} | {mode} | {t['rebuilt_us']:.1f} | {t['index_us']:.2f} | "
                         f"{t['rebuilt_us'] / t['index_us']:.0f}x |")
    if rec.get("cpp") is None:
        lines += ["", f"C++: {TIMING} is not built (bash scripts/setup.sh builds it)."]
    return "\n".join(lines) + "\n"


def run(out: pathlib.Path, queued: int = 4096, repeats: int = 5) -> dict:
    import datetime as dt

    from rmscore.core.cost_profile import cpu_model

    out.mkdir(parents=True, exist_ok=True)
    rec = {"format": "rmscore-bench-planning/1", "queued": queued, "repeats": repeats, "cpu": cpu_model(),
           "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": python_timing(queued, repeats), "cpp": cpp_timing(queued, repeats)}
    (out / "planning.json").write_text(json.dumps(rec, indent=1))
    (out / "planning.md").write_text(markdown(rec))
    return rec
