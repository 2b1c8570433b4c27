"""The Python scoring core (batcher + workers, the server's defaults) driven in-process, no transport: REPS
rollouts of 64 sequences of the scheduling mix in 8 requests at once, 0.5 s apart; each prints its
makespan, its batches' sizes, how long exactly one batch ran (the other core idle: elastic's workers
are 1-thread runs) and the last batches (start ms, end ms, size, worker). From the repository root:
`.venv/bin/python docs/bench/cost-timing_2026-12-07/rollout_inproc.py REPS [server flags, e.g.
--cost-profile FILE]`."""
import argparse, asyncio, pathlib, sys, time, threading, os, collections
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
import numpy as np
from rmscore.core import config as C
from rmscore.core.scoring import ScoringCore, SERVING
from rmscore.runtimes.workers import RUNTIME
from rmscore_tools.workload import LengthMix, make_rollout
from rmscore_tools.bench.scheduling import LENGTHS
p = argparse.ArgumentParser(); C.add_arguments(p)
a = p.parse_args(["--model", "models/default", "--backend", "onnxruntime", "--intra-op-threads", "2", "--inter-op-threads", "1"] + sys.argv[2:])
cfg = C.from_args(a)
core = ScoringCore(cfg, RUNTIME)
ev = threading.Event()
core.start_loading(lambda st: ev.set() if st == SERVING else None)
ev.wait(300)
LOG = []
_orig = core.metrics.batch_ran
def _rec(seconds, size, pad):
    LOG.append((time.perf_counter() - seconds, time.perf_counter(), size, threading.current_thread().name)); _orig(seconds, size, pad)
core.metrics.batch_ran = _rec
reps = int(sys.argv[1])
async def main():
    for r in range(reps):
        roll = make_rollout(np.random.default_rng([0, r, 7]), 64, LengthMix.parse(LENGTHS))
        chunks = [roll[i:i + 8] for i in range(0, 64, 8)]
        LOG.clear(); t0 = time.perf_counter()
        await asyncio.gather(*[core.score_ids(c, None) for c in chunks])
        t1 = time.perf_counter()
        LOG.sort()
        # time with exactly one batch running, and after the last start
        ev_ = sorted([(s, 1) for s, e, *_ in LOG] + [(e, -1) for s, e, *_ in LOG])
        run = 0; last = t0; one = 0; zero = 0
        for t, d in ev_:
            if run == 1: one += t - last
            if run == 0: zero += t - last
            run += d; last = t
        zero += t1 - last
        tail = [(round(1e3*(s-t0)), round(1e3*(e-t0)), n, th[-1]) for s, e, n, th in LOG[-4:]]
        print(f"rollout {r}: {1e3*(t1-t0):.0f} ms, batches {len(LOG)} sizes {[x[2] for x in LOG]}, one running {1e3*one:.0f} ms, none {1e3*zero:.0f} ms; last batches {tail}", flush=True)
        await asyncio.sleep(0.5)
asyncio.run(main())
core.stop()
