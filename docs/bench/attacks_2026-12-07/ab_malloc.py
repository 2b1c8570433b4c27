"""PYTHONMALLOC=pymalloc against PYTHONMALLOC=malloc on one Python kind (argv: rounds, kind), both servers up
at once, one cost table for both, rounds alternating which goes first: one in flight (seq/s, p50 ms), 64 in
flight (seq/s), and the server's CPU ms per request (utime+stime from /proc). docs/bench/attacks_2026-12-07/README.md."""
import asyncio, pathlib, statistics, sys, tempfile, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
import numpy as np
from rmscore_tools import caller, launch
from rmscore_tools.host import machine_info
from rmscore_tools.observe import cpu_s
from rmscore_tools.workload import LengthMix
from rmscore_tools.bench import scheduling
from rmscore_tools.stats import mean_ci

KIND = sys.argv[2] if len(sys.argv) > 2 else "py-http-onnxruntime"
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
tmp = pathlib.Path(tempfile.mkdtemp())
sv = launch.start(KIND, cost_profile_dir=str(tmp / "cache")); sv.stop()
[table] = (tmp / "cache").glob("*.json")
arms = {"pymalloc": {"PYTHONMALLOC": "pymalloc"}, "malloc": {"PYTHONMALLOC": "malloc"}}
servers = {a: launch.start(KIND, cost_profile=str(table), env=e, log_dir=str(tmp / a)) for a, e in arms.items()}
lens = LengthMix.parse(scheduling.LENGTHS).sample(np.random.default_rng(3), 100000)
async def closed(server, conc, secs):
    c = caller.async_client(launch.transport(KIND), caller.target_of(server), chunk_size=1, timeout_s=60)
    n = [0]; lat = []
    try:
        await c.score_ids([[101, 2000, 102]])
        stop = time.monotonic() + secs
        async def one(k):
            i = k
            while time.monotonic() < stop:
                L = int(lens[i % len(lens)]); i += conc
                t = time.perf_counter()
                await c.score_ids([[101] + [2000 + j % 500 for j in range(L - 2)] + [102]])
                lat.append(time.perf_counter() - t); n[0] += 1
        c0 = cpu_s(server.proc.pid); t0 = time.monotonic()
        await asyncio.gather(*[one(k) for k in range(conc)])
        el = time.monotonic() - t0; c1 = cpu_s(server.proc.pid)
    finally:
        await c.close()
    return n[0] / el, statistics.median(lat) * 1e3, (c1 - c0) / n[0] * 1e3

for a, s in servers.items(): print(a, [v for v in open(f"/proc/{s.proc.pid}/environ").read().split("\0") if v.startswith("PYTHONMALLOC")])
res = {a: {"c1": [], "p50": [], "cpu1": [], "c64": [], "cpu64": []} for a in arms}
try:
    for r in range(rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for a in order:
            t1, p50, cpu1 = asyncio.run(closed(servers[a], 1, 5))
            t64, _, cpu64 = asyncio.run(closed(servers[a], 64, 6))
            for k, v in zip(("c1", "p50", "cpu1", "c64", "cpu64"), (t1, p50, cpu1, t64, cpu64)):
                res[a][k].append(v)
            print(r, a, f"c1 {t1:.1f} seq/s p50 {p50:.2f} ms cpu {cpu1:.2f} ms/req | c64 {t64:.1f} seq/s cpu {cpu64:.2f} ms/req", flush=True)
finally:
    for s in servers.values():
        s.stop()
print("CPU:", machine_info()["cpu"])
for k in ("c1", "p50", "cpu1", "c64", "cpu64"):
    ratios = [u / a for u, a in zip(res["malloc"][k], res["pymalloc"][k])]
    print(f"{k}: pymalloc {statistics.mean(res['pymalloc'][k]):.2f} malloc {statistics.mean(res['malloc'][k]):.2f}  malloc/pymalloc {mean_ci(ratios).fmt()}")
