"""ONNX Runtime's CPU arena on vs off, one process, interleaved (docs/cpp_bench.md).

Both servers keep the arena on (the C++ server's model_runner.cc, as the Python backend). This
probe is the evidence for that choice: it times sessions with the arena on and off on the same
batches, interleaved, so the difference is the arena alone (off cost 1.26x at 32x256 here).

    .venv/bin/python -m rmscore_tools.bench.ort_arena_probe [--model models/default] [--threads 2] [--runs 6]
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np
import onnxruntime as ort

from rmscore_tools.host import ROOT


def session(graph: pathlib.Path, arena: bool, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_cpu_mem_arena = arena
    return ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=pathlib.Path, default=ROOT / "models/default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--shapes", default="8x64,32x256", help="batch x length, comma-separated")
    a = ap.parse_args()
    sessions = {arena: session(a.model / "model.onnx", arena, a.threads) for arena in (True, False)}
    rng = np.random.default_rng(0)
    for shape in a.shapes.split(","):
        b, n = map(int, shape.split("x"))
        feed = {"input_ids": rng.integers(1000, 20000, (b, n)).astype(np.int64),
                "attention_mask": np.ones((b, n), np.int64)}
        for s in sessions.values():
            s.run(None, feed)
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(a.runs):
            for arena in ((True, False) if rep % 2 == 0 else (False, True)):  # alternate who goes first
                t0 = time.perf_counter()
                sessions[arena].run(None, feed)
                times[arena].append(time.perf_counter() - t0)
        on, off = (float(np.median(times[k])) * 1e3 for k in (True, False))
        print(f"batch {b}x{n}: arena on {on:.0f} ms, off {off:.0f} ms, off/on {off / on:.2f}x", flush=True)


if __name__ == "__main__":
    main()
