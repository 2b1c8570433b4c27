"""Where a rollout's time goes, cpp-grpc against py-grpc-onnxruntime, defaults, fresh cost cache each:
makespan / ideal, the batches' wall model time per sequence (metrics), the model threads' CPU per
sequence (/proc), the batch sizes. Fresh starts alternate kinds."""
import asyncio, collections, os, pathlib, re, statistics, sys, tempfile, time
sys.path.insert(0, "/work/main/tools")
from rmscore_tools import launch, caller, loadgen
from rmscore_tools.workload import LengthMix
from rmscore_tools.bench import scheduling
from rmscore_tools.bench.presets import PRESETS
from rmscore_tools.stats import mean_ci
kinds = sys.argv[1].split(","); reps = int(sys.argv[2])
HZ = os.sysconf("SC_CLK_TCK")
s = PRESETS["short"]
tmp = pathlib.Path(tempfile.mkdtemp())
wl = loadgen.Workload(LengthMix.parse(scheduling.LENGTHS), 1, 64)
rolls = wl.rollouts(7, 12)
plans = scheduling.best_plans(s, "models/default", 0, ["onnxruntime"], tmp)["onnxruntime"]
ideal = 64 / plans["best_seq_s"]
print("best plan", round(plans["best_seq_s"], 1), "seq/s; CPU", open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t"), flush=True)
def threads(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            st = open(f"/proc/{pid}/task/{t}/stat").read()
        except OSError:
            continue
        f = st.rsplit(")", 1)[1].split()
        out[int(t)] = (int(f[11]) + int(f[12])) / HZ
    return out
def metric(text, name):
    tot = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            tot += float(line.rsplit(" ", 1)[1])
    return tot
def hist_sizes(text):
    b = {}
    for line in text.splitlines():
        m = re.match(r'rmscore_batch_size_bucket\{.*le="([^"]+)".*\} (\S+)', line)
        if m: b[m.group(1)] = float(m.group(2))
    return b
res = {k: collections.defaultdict(list) for k in kinds}
flags = dict(intra_op_threads=s.intra_op_threads, inter_op_threads=s.inter_op_threads)
for r in range(reps):
    for kind in (kinds if r % 2 == 0 else kinds[::-1]):
        sv = launch.start(kind, cost_profile_dir=str(tmp / f"cache-{kind}-{r}"), **flags)
        try:
            async def go():
                c = caller.async_client(launch.transport(kind), caller.target_of(sv), chunk_size=8, timeout_s=60)
                try:
                    await loadgen.rollouts(c, rolls[:2])
                    m0 = sv.metrics_text(); t0 = threads(sv.proc.pid); w0 = time.perf_counter()
                    out = await loadgen.rollouts(c, rolls[2:])
                    w1 = time.perf_counter(); t1 = threads(sv.proc.pid); m1 = sv.metrics_text()
                finally:
                    await c.close()
                return out, m0, m1, t0, t1, w1 - w0
            out, m0, m1, t0, t1, wall = asyncio.run(go())
        finally:
            sv.stop()
        nseq = 64 * 10
        mk = statistics.mean(out["makespans_s"]) if "makespans_s" in out else None
        d = sorted(((t1[t] - t0.get(t, 0)) for t in t1), reverse=True)
        inf = metric(m1, "rmscore_batch_inference_seconds_sum") - metric(m0, "rmscore_batch_inference_seconds_sum")
        nb = metric(m1, "rmscore_batch_inference_seconds_count") - metric(m0, "rmscore_batch_inference_seconds_count")
        R = res[kind]
        R["mk"].append(mk / ideal if mk else float("nan")); R["wall_ms"].append(wall / nseq * 1e3)
        R["inf_ms"].append(inf / nseq * 1e3); R["cpu_top2_ms"].append(sum(d[:2]) / nseq * 1e3)
        R["cpu_rest_ms"].append(sum(d[2:]) / nseq * 1e3); R["batches"].append(nb)
        print(f"{r} {kind}: makespan/ideal {R['mk'][-1]:.3f}; per seq: wall {R['wall_ms'][-1]:.1f} ms, batch model wall sum {R['inf_ms'][-1]:.1f} ms, top-2 threads CPU {R['cpu_top2_ms'][-1]:.1f} ms, other threads CPU {R['cpu_rest_ms'][-1]:.2f} ms; {nb:.0f} batches (mean {nseq/max(nb,1):.1f} seq)", flush=True)
print("ideal", round(ideal * 1e3), "ms")
for k in kinds:
    print(k, {m: mean_ci(v).fmt() for m, v in res[k].items()})
