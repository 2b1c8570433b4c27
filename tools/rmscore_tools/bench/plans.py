"""The best in-process plan of each runtime: the bar `rmscore bench --scheduling` holds servers to.

Run as a child process (`python -m rmscore_tools.bench.plans SPEC.json OUT.json`), like
inproc.py, so the runtimes' thread pools are gone when the servers are measured. For each runtime
(made as the servers make it: rmscore.runtimes.create, the same threads) one pool of sequences of
the load's length mix is scored in each plan: batch 1 in arrival order, and sorted batches of 2 to
64 (sorted by length, cut every B: the least padding B allows). Nothing else: no transport, no
queue. The best plan is the fastest of them, measured in the same repetition as the servers.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np

from rmscore_tools.bench.inproc import _load, score_batches
from rmscore_tools.workload import LengthMix, make_rollout

SIZES = (1, 2, 4, 8, 16, 32, 64)


def plan(lengths: list[int], size: int) -> list[list[int]]:
    """Indices cut into batches of `size`: arrival order for 1, else sorted by length."""
    if size == 1:
        return [[i] for i in range(len(lengths))]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[k:k + size] for k in range(0, len(order), size)]


def run(spec: dict) -> dict:
    from rmscore.model.repository import load_repo

    repo = load_repo(spec["model"])
    mix = LengthMix.parse(spec["lengths"])
    pool = make_rollout(np.random.default_rng([spec["seed"], spec["rep"], 5]), spec["pool_size"], mix)
    lengths = [len(x) for x in pool]
    out = {}
    for rt in spec["runtimes"]:
        backend, _ = _load(dict(spec, max_batch_size=max(SIZES), max_batch_tokens=max(SIZES) * max(lengths)), repo, rt)
        sizes = list(SIZES)
        if spec["rep"] % 2:  # drift in machine load spreads over the plans
            sizes.reverse()
        got = {}
        for size in sizes:
            batches = plan(lengths, size)
            score_batches(backend, pool[:size * 2], plan(lengths[:size * 2], size), repo.pad_token_id)  # shapes warm
            _, elapsed = score_batches(backend, pool, batches, repo.pad_token_id)
            got[str(size)] = len(pool) / elapsed
            print(f"[plans] {rt} batch {size}: {got[str(size)]:.1f} seq/s", file=sys.stderr, flush=True)
        out[rt] = {"throughput_seq_s": got, "best_plan": max(got, key=got.get), "best_seq_s": max(got.values())}
        del backend
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m rmscore_tools.bench.plans SPEC.json OUT.json", file=sys.stderr)
        return 2
    t = time.perf_counter()
    result = {"runtimes": run(json.loads(pathlib.Path(argv[0]).read_text())), "seconds": time.perf_counter() - t}
    pathlib.Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
