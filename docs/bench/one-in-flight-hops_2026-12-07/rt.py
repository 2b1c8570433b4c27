"""rt.py KINDS: p50 and mean of one sequence at a time (3 and 96 tokens), 3 rounds of 400 calls per kind."""
import asyncio, statistics, time, sys
from rmscore_tools import caller, launch
async def loop(kind, server, n, L):
    c = caller.async_client(launch.transport(kind), caller.target_of(server), chunk_size=1, timeout_s=60)
    seq = [101] + [2000 + j for j in range(L - 2)] + [102]
    for _ in range(50): await c.score_ids([seq])
    lat = []
    for _ in range(n):
        t = time.perf_counter(); await c.score_ids([seq]); lat.append((time.perf_counter() - t) * 1e3)
    await c.close()
    return statistics.median(lat), statistics.mean(lat)
kinds = sys.argv[1].split(",")
servers = {k: launch.start(k) for k in kinds}
try:
    for r in range(3):
        for k in kinds:
            for L in (3, 96):
                p50, m = asyncio.run(loop(k, servers[k], 400, L))
                print(f"{r} {k:22s} L={L:3d} p50 {p50:.3f} mean {m:.3f} ms", flush=True)
finally:
    for s in servers.values(): s.stop()
