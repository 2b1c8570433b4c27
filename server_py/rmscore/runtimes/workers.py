"""Model workers (--model-workers): the sessions the batcher threads run batches on.

On a CPU, one session of 2 threads and two sessions of 1 thread do not score alike: a batch alone
runs faster on every thread (one session of 2: 92 seq/s at batch 1 here), and two batches at once
run faster on a thread each (two of 1: 100 seq/s together, where the 2-thread session run from two
threads at once gives 74). No fixed split wins at every load, so the default, `elastic`, keeps both:
one batcher thread per intra-op thread, all sharing one session of one intra-op thread (an ONNX
Runtime run is thread-safe and works on its caller's thread, so T callers of one 1-thread session
score as fast as T sessions, with one copy of the weights), and a session of every intra-op thread
that the batcher gives a batch starting alone (core/batcher.py, `lone`). Eager PyTorch does the same
with one model, each run setting its caller's thread count (torch_backend.ThreadsRun). A count W keeps W sessions
of T / W threads; `auto` measures 1, 2, 4 ... at warm-up and keeps the fastest for every load.
docs/batching.md, "Threads", has the measurements; the C++ server does the same
(server_cpp/src/main.cc).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from rmscore.core.config import ELASTIC_WORKERS, ServeConfig
from rmscore.core.runtime import Backend, Runtime, Workers, progress
from rmscore.model.repository import ModelRepo
from rmscore.runtimes import create, self_check

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


def elastic_applies(cfg: ServeConfig) -> bool:
    """Whether `elastic` splits threads here: ONNX Runtime or eager PyTorch on a CPU with more than
    one intra-op thread. torch.compile's generated kernels fix their thread count when compiled, and
    on a GPU the intra-op threads are not where a batch runs."""
    return cfg.backend in ("onnxruntime", "eager") and cfg.device == "cpu" and cfg.intra_op_threads > 1


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


def start_workers(cfg: ServeConfig, repo: ModelRepo, fixed: int | None) -> Workers:
    """The workers to serve with: `elastic` (ELASTIC_WORKERS), `fixed` of them, or (--model-workers
    auto, `fixed` None) the count that measured fastest. torch.compile keeps one under auto: every
    worker compiles its own graph."""
    if fixed == ELASTIC_WORKERS:
        return _elastic(cfg, repo)
    return Workers(_fixed_or_auto(cfg, repo, fixed))


def _elastic(cfg: ServeConfig, repo: ModelRepo) -> Workers:
    threads = cfg.intra_op_threads
    if not elastic_applies(cfg):
        why = "one intra-op thread" if threads == 1 else (
            "a GPU" if cfg.device != "cpu" else "torch.compile's kernels fix their thread count when compiled")
        progress(f"model workers: elastic keeps 1 x {threads} intra-op threads ({why})")
        return Workers(create_workers(cfg, repo, 1))
    if cfg.backend == "eager":
        # One model: torch's intra-op count belongs to the calling thread, set before each run.
        model = create(dataclasses.replace(cfg, model_workers=1), repo)
        shared, lone = model.on_threads(1), model.on_threads(threads)
        progress(f"model workers: elastic, up to {threads} batches at once on one model at 1 thread each, "
                 f"a batch alone on {threads} threads")
    else:
        shared = create(dataclasses.replace(cfg, intra_op_threads=1, model_workers=1), repo)
        lone = create(dataclasses.replace(cfg, model_workers=1), repo)
        progress(f"model workers: elastic, up to {threads} batches at once on one 1-thread session, "
                 f"a batch alone on a {threads}-thread one")
    return Workers([shared] * threads, lone)


def _fixed_or_auto(cfg: ServeConfig, repo: ModelRepo, fixed: int | None) -> list[Backend]:
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
    """PyTorch's intra-op thread count is the calling thread's, and threads started later take the
    last count set: set it to this worker's before timing."""
    use = getattr(backend, "use_threads", None)
    if use is not None:
        use()


#: What the front ends' runners hand ScoringCore (core/runtime.py): these workers, self-checked
#: against the golden scores.
RUNTIME = Runtime(start_workers, self_check)
