"""In-process batch 1 back to back against runs with a pause after each (sleeping, or the caller
spinning), as a one-in-flight round trip makes. From the repository root:
`M=models/default .venv/bin/python docs/bench/scheduling-goals_2026-12-06-night/gap_inproc.py`."""
import pathlib, sys, time, numpy as np
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from rmscore_tools.bench.inproc import _load
from rmscore_tools.workload import LengthMix, make_rollout
from rmscore_tools.bench.scheduling import LENGTHS
from rmscore.model.repository import load_repo
from rmscore.model.padding import pad_batch
import os
model = os.environ["M"]
repo = load_repo(model)
spec = {"model": model, "seed": 0, "rollout_size": 64, "lengths": LENGTHS, "intra_op_threads": 2, "inter_op_threads": 1, "max_batch_size": 64, "max_batch_tokens": 64*256}
backend, _ = _load(spec, repo, "onnxruntime")
pool = make_rollout(np.random.default_rng([0, 0, 5]), 256, LengthMix.parse(LENGTHS))
def run(gap_s, spin):
    t = time.perf_counter(); model_t = 0
    for s in pool:
        a = time.perf_counter()
        ids, mask = pad_batch([s], repo.pad_token_id); backend.score(ids, mask)
        model_t += time.perf_counter() - a
        if gap_s:
            if spin:
                e = time.perf_counter() + gap_s
                while time.perf_counter() < e: pass
            else:
                time.sleep(gap_s)
    return len(pool)/(time.perf_counter()-t), 1e3*model_t/len(pool)
for r in range(3):
    for g, spin in ((0, 0), (0.0015, 0), (0.0015, 1), (0.005, 0)):
        thr, m = run(g, spin)
        print(f"gap {g*1e3:.1f} ms spin={spin}: {thr:.1f} seq/s, model {m:.2f} ms/seq", flush=True)
