"""Model workers (--model-workers): W sessions of the model, each with intra-op-threads / W threads.

On a CPU, one session of 2 threads and two sessions of 1 thread do not score alike: small batches
leave a second intra-op thread idle, and two sessions running two batches at once use both cores.
Which is faster depends on the machine, the model and the load, so `auto` measures it at warm-up
and says what it chose. The batcher runs one thread per worker (core/batcher.py); the C++ server
does the same (server_cpp/src/main.cc).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from rmscore.core.config import ServeConfig
from rmscore.model.repository import ModelRepo
from rmscore.runtimes import Backend, create, progress

#: The batch `auto` times: a mid-sized, mid-length batch of a trainer's load.
PROBE_SHAPE = (8, 128)
PROBE_SECONDS = 1.5


def candidates(intra_op_threads: int) -> list[int]:
    """1, 2, 4, ... up to the thread count: each worker keeps at least one thread."""
    out, w = [], 1
    while w <= intra_op_threads:
        out.append(w)
        w *= 2
    return out


def create_workers(cfg: ServeConfig, repo: ModelRepo, count: int) -> list[Backend]:
    per_worker = dataclasses.replace(cfg, intra_op_threads=cfg.intra_op_threads // count, model_workers=1)
    return [create(per_worker, repo) for _ in range(count)]


def throughput(backends: list[Backend], seconds: float = PROBE_SECONDS) -> float:
    """Sequences per second with every backend scoring PROBE_SHAPE batches at once, in threads."""
    b, n = PROBE_SHAPE
    ids = np.random.default_rng(0).integers(1000, 2000, size=(b, n), dtype=np.int64)
    mask = np.ones((b, n), np.int64)
    for be in backends:
        be.score(ids, mask)  # the first run of a shape allocates: not timed
    done = [0] * len(backends)
    t_end = time.perf_counter() + seconds

    def work(i: int) -> None:
        while time.perf_counter() < t_end:
            backends[i].score(ids, mask)
            done[i] += b

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def start_workers(cfg: ServeConfig, repo: ModelRepo, fixed: int | None) -> list[Backend]:
    """The workers to serve with: `fixed` of them, or (--model-workers auto, `fixed` None) the count
    that measured fastest. torch.compile keeps one under auto: every worker compiles its own graph."""
    if fixed is None and cfg.backend == "compile":
        progress("model workers: auto keeps 1 for torch.compile (each worker would compile its graph again)")
        fixed = 1
    if fixed is not None:
        workers = create_workers(cfg, repo, fixed)
        progress(f"model workers: {fixed} x {cfg.intra_op_threads // fixed} intra-op threads")
        return workers
    best: tuple[float, list[Backend]] | None = None
    seen = []
    for count in candidates(cfg.intra_op_threads):
        workers = create_workers(cfg, repo, count)
        for w in workers:
            _use_threads(w)
        rate = throughput(workers)
        seen.append(f"{count} x {cfg.intra_op_threads // count}: {rate:.1f} seq/s")
        if best is None or rate > best[0]:
            best = (rate, workers)
    chosen = best[1]
    for w in chosen:
        _use_threads(w)
    progress(f"model workers: {len(chosen)} x {cfg.intra_op_threads // len(chosen)} intra-op threads "
             f"(auto, batch {PROBE_SHAPE[0]} x {PROBE_SHAPE[1]}: {'; '.join(seen)})")
    return chosen


def _use_threads(backend: Backend) -> None:
    """PyTorch's intra-op thread count is one per process: set it back to this worker's before timing."""
    use = getattr(backend, "use_threads", None)
    if use is not None:
        use()

