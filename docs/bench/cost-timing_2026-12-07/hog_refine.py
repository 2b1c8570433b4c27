"""How other processes' load enters a cost table refined by the wall clock, and not one refined by the
run's thread CPU time. For each arm (a server_py tree on PYTHONPATH: the wall clock before, the thread's
CPU after), a fresh py-grpc-onnxruntime server measures its table into an empty cache on an idle
machine; then HOGS busy processes run while 16 callers keep sequences of the scheduling mix in flight
for SECONDS; the server stops (writing the refined table back) and each refined cell is compared with
the same cell as measured. From the repository root:
`.venv/bin/python docs/bench/cost-timing_2026-12-07/hog_refine.py OLD_SERVER_PY NEW_SERVER_PY [SECONDS] [HOGS]`
(ORDER=reverse runs the thread-CPU arm first)."""
import asyncio, json, os, pathlib, subprocess, sys, tempfile, time
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tools"))
import numpy as np
from rmscore_tools import launch, caller
from rmscore_tools.workload import LengthMix
from rmscore_tools.bench import scheduling

ARMS = {"wall clock (before)": sys.argv[1], "thread CPU (after)": sys.argv[2]}
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20
hogs_n = int(sys.argv[4]) if len(sys.argv) > 4 else 2
lens = LengthMix.parse(scheduling.LENGTHS).sample(np.random.default_rng(3), 100000)
print("CPU:", open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t"), flush=True)


async def load(server, conc, secs):
    c = caller.async_client("grpc", server.target, chunk_size=1, timeout_s=120)
    n = [0]; stop = time.monotonic() + secs

    async def one(k):
        i = k
        while time.monotonic() < stop:
            L = int(lens[i % len(lens)]); i += conc
            await c.score_ids([[101] + [2000 + j % 500 for j in range(L - 2)] + [102]])
            n[0] += 1
    try:
        await asyncio.gather(*[one(k) for k in range(conc)])
    finally:
        await c.close()
    return n[0] / secs


def cells(doc):
    t = doc["table"]
    return {(b, n): t["cost_us"][i][j] for i, b in enumerate(t["batch_sizes"]) for j, n in enumerate(t["lengths"])}


for arm, tree in (reversed(ARMS.items()) if os.environ.get("ORDER") == "reverse" else ARMS.items()):
    cache = pathlib.Path(tempfile.mkdtemp()) / "cache"
    env = {"PYTHONPATH": tree}
    s = launch.start("py-grpc-onnxruntime", cost_profile_dir=str(cache), intra_op_threads=2, env=env)
    s.stop()
    [path] = cache.glob("*.json")
    measured = cells(json.loads(path.read_text()))
    print(f"{arm}: measured at 128 tokens, ms a sequence: " + ", ".join(
        f"B={b} {measured[b, 128] / b / 1e3:.1f}" for b in (1, 2, 4, 8, 16, 32)), flush=True)
    s = launch.start("py-grpc-onnxruntime", cost_profile_dir=str(cache), intra_op_threads=2, env=env)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs_n)]
    try:
        rate = asyncio.run(load(s, 16, seconds))
    finally:
        for h in hogs:
            h.kill(); h.wait()
        s.stop()
    doc = json.loads(path.read_text())
    refined = cells(doc)
    moved = {k: refined[k] / measured[k] for k in measured if refined[k] != measured[k]}
    r = sorted(moved.values())
    print(f"{arm}: {rate:.1f} seq/s beside {hogs_n} busy processes for {seconds:.0f} s; timing {doc.get('timing', 'unsaid')}, "
          f"{doc.get('refined_batches')} batches refined {len(moved)} of {len(measured)} cells; refined / measured: "
          f"median {np.median(r):.2f}, min {r[0]:.2f}, max {r[-1]:.2f}", flush=True)
    for (b, n), v in sorted(moved.items(), key=lambda kv: -kv[1])[:6]:
        print(f"    B={b} L={n}: measured {measured[b, n] / 1e3:.1f} ms, refined {refined[b, n] / 1e3:.1f} ms ({v:.2f}x)")
