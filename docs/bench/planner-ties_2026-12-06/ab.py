"""A/B of two builds of one kind, fresh starts alternating on one cost table (measured once, copied
for every start): rollout makespan / ideal (12 rollouts of 64 in chunks of 8), then throughput at
1 and 64 in flight. `ab.py KIND REPS OLD NEW`: OLD and NEW are a server_py directory (PYTHONPATH) for
the Python kinds, a rmscore-server-cpp binary for cpp-grpc. Used for the planner's tie-break."""
import asyncio, os, pathlib, shutil, statistics, sys, tempfile, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from rmscore_tools import launch, caller, loadgen
from rmscore_tools.workload import LengthMix
from rmscore_tools.bench import scheduling
from rmscore_tools.bench.presets import PRESETS
from rmscore_tools.stats import mean_ci
kind, reps = sys.argv[1], int(sys.argv[2])
ARMS = {"old": sys.argv[3], "new": sys.argv[4]}
s = PRESETS["short"]
tmp = pathlib.Path(tempfile.mkdtemp())
wl = loadgen.Workload(LengthMix.parse(scheduling.LENGTHS), 1, 64)
rolls = wl.rollouts(7, 12)
plans = scheduling.best_plans(s, "models/default", 0, ["onnxruntime"], tmp)["onnxruntime"]
ideal = 64 / plans["best_seq_s"]
print("best plan", round(plans["best_seq_s"], 1), flush=True)
cache = tmp / "cache"
sv = launch.start(kind, cost_profile_dir=str(cache), intra_op_threads=s.intra_op_threads, inter_op_threads=s.inter_op_threads); sv.stop()
frozen = tmp / "frozen"; shutil.copytree(cache, frozen)
res = {a: {"mk": [], "c64": [], "c1": []} for a in ARMS}
async def measure(server):
    c = caller.async_client(launch.transport(kind), caller.target_of(server), chunk_size=8, timeout_s=60)
    try:
        await loadgen.rollouts(c, rolls[:2])
        r = await loadgen.rollouts(c, rolls[2:])
    finally:
        await c.close()
    c = caller.async_client(launch.transport(kind), caller.target_of(server), chunk_size=1, timeout_s=60)
    import numpy as np
    lens = LengthMix.parse(scheduling.LENGTHS).sample(np.random.default_rng(3), 100000)
    async def closed(conc, secs):
      n = [0]; stop = time.monotonic() + secs
      async def one(k):
        i = k
        while time.monotonic() < stop:
            L = int(lens[i % len(lens)]); i += conc
            await c.score_ids([[101] + [2000 + j % 500 for j in range(L - 2)] + [102]])
            n[0] += 1
      t0 = time.monotonic()
      await asyncio.gather(*[one(k) for k in range(conc)])
      return n[0] / (time.monotonic() - t0)
    try:
        c1 = await closed(1, 6)
        c64 = await closed(64, 8)
    finally:
        await c.close()
    return statistics.mean(r["makespans_s"]) / ideal, c64, c1
for rep in range(reps):
    for arm in (("old", "new") if rep % 2 == 0 else ("new", "old")):
        d = tmp / f"c-{rep}-{arm}"; shutil.copytree(frozen, d)
        if kind == "cpp-grpc":
            launch.CPP_BINARY = pathlib.Path(ARMS[arm])
        server = launch.start(kind, cost_profile_dir=str(d), intra_op_threads=s.intra_op_threads,
                              inter_op_threads=s.inter_op_threads,
                              env=None if kind == "cpp-grpc" else {"PYTHONPATH": ARMS[arm]})
        try:
            mk, c64, c1 = asyncio.run(measure(server))
        finally:
            server.stop(30)
        res[arm]["mk"].append(mk); res[arm]["c64"].append(c64); res[arm]["c1"].append(c1)
        print(f"rep {rep} {arm}: makespan/ideal {mk:.3f}, c64 {c64:.1f}, c1 {c1:.1f} seq/s", flush=True)
for m in ("mk", "c64", "c1"):
    r = [a / b for a, b in zip(res["new"][m], res["old"][m])]
    print(f"{kind} {m}: new/old {mean_ci(r).fmt()}; old {statistics.mean(res['old'][m]):.3f}, new {statistics.mean(res['new'][m]):.3f}")
