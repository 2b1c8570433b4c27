"""drive.py L: one L-token sequence at a time against traced.py's server for 8 s (README.md)."""
import asyncio, statistics, time, sys, subprocess, json, os, pathlib, tempfile
from rmscore_tools import caller, launch
port = 50997; L = int(sys.argv[1])
HERE = pathlib.Path(__file__).resolve().parent
TRACE = os.path.join(tempfile.mkdtemp(), "trace.json")
env = dict(os.environ, PYTHONPATH=str(HERE.parents[2] / "server_py"), TRACE_JSON=TRACE)
p = subprocess.Popen([sys.executable, str(HERE / "traced.py"), "serve", "--transport", "grpc", "--backend", "onnxruntime", "--port", str(port)],
                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
launch.wait_ready("py-grpc-onnxruntime", port, p, time.monotonic() + 300)
async def loop(secs):
    c = caller.async_client("grpc", f"127.0.0.1:{port}", chunk_size=1, timeout_s=60)
    seq = [101] + [2000 + j for j in range(L - 2)] + [102]
    lat = []; end = time.monotonic() + secs
    while time.monotonic() < end:
        t = time.perf_counter(); await c.score_ids([seq]); lat.append((time.perf_counter() - t) * 1e6)
    await c.close(); return statistics.median(lat)
try:
    asyncio.run(loop(3)); time.sleep(2.5); os.remove(TRACE)
    print("client p50 us", round(asyncio.run(loop(8)))); time.sleep(2.5)
    for k, v in json.load(open(TRACE)).items(): print(f"{k:24s} {v[0]:8.0f} us  n={v[1]}")
finally:
    p.terminate(); p.wait()
