"""The Python scoring core (batcher + workers, the server's defaults) driven in-process, no transport:
closed loops at C, the same workload as bench --scheduling; prints each load's batch sizes, model time
per sequence and padding. Separates the core's loss from gRPC's. From the repository root:
`.venv/bin/python docs/bench/planner-worth_2026-12-06/core_inproc.py 64 8 [server flags]`
(concurrencies, window seconds)."""
import argparse, asyncio, pathlib, sys, time, threading, os
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from rmscore.core import config as C
from rmscore.core.scoring import ScoringCore, SERVING
from rmscore.runtimes.workers import RUNTIME
from rmscore_tools import loadgen
from rmscore_tools.workload import LengthMix
from rmscore_tools.bench.scheduling import LENGTHS
p = argparse.ArgumentParser(); C.add_arguments(p)
a = p.parse_args(["--model", "models/default", "--backend", "onnxruntime", "--intra-op-threads", "2", "--inter-op-threads", "1"] + sys.argv[3:])
cfg = C.from_args(a)
core = ScoringCore(cfg, RUNTIME)
ev = threading.Event()
core.start_loading(lambda st: ev.set() if st == SERVING else None)
ev.wait(300)
import collections
LOG = []
_orig = core.metrics.batch_ran
def _rec(seconds, size, pad):
    LOG.append((size, seconds, pad)); _orig(seconds, size, pad)
core.metrics.batch_ran = _rec
wl = loadgen.Workload(LengthMix.parse(LENGTHS), 1, 64)
reqs = wl.requests(0)
conc = [int(x) for x in sys.argv[1].split(",")]; window = float(sys.argv[2])
async def main():
    for c in conc:
        done = 0; stop = time.monotonic() + window; i = [0]
        async def worker(k):
            nonlocal done
            while time.monotonic() < stop:
                r = reqs[i[0] % len(reqs)]; i[0] += 1
                await core.score_ids(r, None)
                done += len(r)
        t = time.monotonic(); LOG.clear()
        await asyncio.gather(*[worker(k) for k in range(c)])
        n = sum(x[0] for x in LOG)
        print(f"core in-process c{c}: {done / (time.monotonic() - t):.1f} seq/s; batches {len(LOG)}, mean {n/len(LOG):.2f}, "
              f"model ms/seq {1e3*sum(x[1] for x in LOG)/n:.1f}, padding {sum(x[2] for x in LOG)/len(LOG):.3f}, sizes {sorted(collections.Counter(x[0] for x in LOG).items())}", flush=True)
asyncio.run(main())
core.stop()
