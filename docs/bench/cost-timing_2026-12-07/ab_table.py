"""What a cost table refined by the wall clock cost this machine: one kind served with the table its cache
held (cached-table_before.json, refined through 10,305 batches by the wall clock, before profiles said
their timing) against one measured now by the same server (fresh starts alternating, each table given as
--cost-profile, which a server loads as written and never rewrites): rollout makespan / ideal (12
rollouts of 64 in chunks of 8), then throughput at 1 and 64 in flight, as planner-ties_2026-12-06/ab.py.
From the repository root: `.venv/bin/python docs/bench/cost-timing_2026-12-07/ab_table.py KIND REPS`."""
import asyncio, json, pathlib, shutil, statistics, sys, tempfile, time
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tools"))
import numpy as np
from rmscore_tools import launch, caller, loadgen
from rmscore_tools.workload import LengthMix
from rmscore_tools.bench import scheduling
from rmscore_tools.bench.presets import PRESETS
from rmscore_tools.stats import mean_ci

kind, reps = sys.argv[1], int(sys.argv[2])
s = PRESETS["short"]
tmp = pathlib.Path(tempfile.mkdtemp())
wl = loadgen.Workload(LengthMix.parse(scheduling.LENGTHS), 1, 64)
rolls = wl.rollouts(7, 12)
plans = scheduling.best_plans(s, "models/default", 0, ["onnxruntime"], tmp)["onnxruntime"]
ideal = 64 / plans["best_seq_s"]
print("best plan", round(plans["best_seq_s"], 1), "seq/s; CPU", open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t"), flush=True)
flags = dict(intra_op_threads=s.intra_op_threads, inter_op_threads=s.inter_op_threads)
# The fresh arm: measured once by this server at its defaults (the new clock), then frozen.
sv = launch.start(kind, cost_profile_dir=str(tmp / "cache"), **flags); sv.stop()
[fresh] = (tmp / "cache").glob("*.json")
TABLES = {"cached": HERE / "cached-table_before.json", "fresh": fresh}
print("fresh table:", json.loads(fresh.read_text())["timing"], flush=True)
res = {a: {"mk": [], "c64": [], "c1": []} for a in TABLES}
lens = LengthMix.parse(scheduling.LENGTHS).sample(np.random.default_rng(3), 100000)


async def measure(server):
    c = caller.async_client(launch.transport(kind), caller.target_of(server), chunk_size=8, timeout_s=60)
    try:
        await loadgen.rollouts(c, rolls[:2])
        r = await loadgen.rollouts(c, rolls[2:])
    finally:
        await c.close()
    c = caller.async_client(launch.transport(kind), caller.target_of(server), chunk_size=1, timeout_s=60)

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
    for arm in (("cached", "fresh") if rep % 2 == 0 else ("fresh", "cached")):
        table = tmp / f"t-{rep}-{arm}.json"; shutil.copy(TABLES[arm], table)
        server = launch.start(kind, cost_profile=str(table), **flags)
        try:
            mk, c64, c1 = asyncio.run(measure(server))
        finally:
            server.stop(30)
        res[arm]["mk"].append(mk); res[arm]["c64"].append(c64); res[arm]["c1"].append(c1)
        print(f"rep {rep} {arm}: makespan/ideal {mk:.3f}, c64 {c64:.1f}, c1 {c1:.1f} seq/s", flush=True)
for m in ("mk", "c64", "c1"):
    r = [a / b for a, b in zip(res["fresh"][m], res["cached"][m])]
    print(f"{kind} {m}: fresh/cached {mean_ci(r).fmt()}; cached {statistics.mean(res['cached'][m]):.3f}, "
          f"fresh {statistics.mean(res['fresh'][m]):.3f}")
