"""`rmscore bench --client-cost`: what the trainer's client adds to a call at one in flight.

At one request in flight every microsecond the client spends is on the critical path: issue 27 holds
a server at one in flight to 0.95 of the runtime's in-process batch-1 throughput, and
`rmscore bench --scheduling` measures that through rmscore_client. This bench puts the client's own
cost beside the bare library it rides on, side by side in one run:

- HTTP (py-http-onnxruntime): `AsyncHttpRewardClient` (aiohttp), a bare `aiohttp.ClientSession`, and
  a bare `httpx.AsyncClient` (the client's transport until it moved to aiohttp).
- gRPC (cpp-grpc): `AsyncRewardClient` and a bare `grpc.aio` stub.

One sequence per call, lengths of the scheduling bench's mix, sequential calls; each round runs every
client once in an order that alternates, so drift in the machine's load spreads over them. Per client:
wall time per call and the client process's CPU time per call (grpcio's own threads included). Ratios
are per round (client / the client's bare library), mean with a 95% t-interval over rounds. Writes
OUT/client_cost.json and OUT/client_cost.md.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import time

import numpy as np

from rmscore_tools import caller, launch
from rmscore_tools.host import machine_info
from rmscore_tools.stats import mean_ci
from rmscore_tools.workload import LengthMix, make_rollout

LENGTHS = "lognormal:96:0.6:16:256"


def _body(seq: list[int]) -> dict:
    return {"sequences": [{"tokens": seq}], "truncation": "none", "timeout_ms": 30000.0}


async def _timed(seqs, call) -> tuple[float, float]:
    await call(seqs[0])  # the connection is open before the clock starts
    t, c = time.perf_counter(), time.process_time()
    for s in seqs:
        await call(s)
    return (time.perf_counter() - t) / len(seqs) * 1e3, (time.process_time() - c) / len(seqs) * 1e3


async def _ours(server, seqs):
    client = caller.async_client(server.transport, caller.target_of(server), chunk_size=1, timeout_s=30)
    try:
        return await _timed(seqs, lambda s: client.score_ids([s]))
    finally:
        await client.close()


async def _aiohttp(url: str, seqs):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async def call(s):
            async with session.post(url + "/rmscore/v1/score", json=_body(s)) as r:
                json.loads(await r.read())
        return await _timed(seqs, call)


async def _httpx(url: str, seqs):
    import httpx

    async with httpx.AsyncClient(base_url=url) as client:
        async def call(s):
            (await client.post("/rmscore/v1/score", json=_body(s))).json()
        return await _timed(seqs, call)


async def _grpc_aio(target: str, seqs):
    import grpc
    from rmscore_client.v1 import reward_pb2 as pb, reward_pb2_grpc as pbg

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pbg.RewardModelStub(channel)
        return await _timed(seqs, lambda s: stub.Score(
            pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=s))]), timeout=30))


CLIENTS = {  # name: (kind, bare library it is compared with, runner)
    "http: rmscore_client (aiohttp)": ("py-http-onnxruntime", "http: bare aiohttp", _ours),
    "http: bare aiohttp": ("py-http-onnxruntime", None, lambda S, q: _aiohttp(S.base_url, q)),
    "http: bare httpx": ("py-http-onnxruntime", "http: bare aiohttp", lambda S, q: _httpx(S.base_url, q)),
    "grpc: rmscore_client": ("cpp-grpc", "grpc: bare grpc.aio", _ours),
    "grpc: bare grpc.aio": ("cpp-grpc", None, lambda S, q: _grpc_aio(S.target, q)),
}


def run(out: pathlib.Path, rounds: int = 5, calls: int = 200, seed: int = 7) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    seqs = [[int(t) for t in s] for s in make_rollout(np.random.default_rng(seed), calls, LengthMix.parse(LENGTHS))]
    servers = {k: launch.start(k) for k in sorted({v[0] for v in CLIENTS.values()})}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
    try:
        for r in range(rounds):
            order = list(CLIENTS) if r % 2 == 0 else list(reversed(CLIENTS))
            for name in order:
                got[name].append(asyncio.run(CLIENTS[name][2](servers[CLIENTS[name][0]], seqs)))
                print(f"[client-cost] round {r + 1}/{rounds} {name}: wall {got[name][-1][0]:.2f} ms, "
                      f"client CPU {got[name][-1][1]:.2f} ms a call", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    rows = {}
    for name, (kind, bare, _) in CLIENTS.items():
        wall, cpu = (np.array([x[i] for x in got[name]]) for i in (0, 1))
        row = {"kind": kind, "wall_ms": mean_ci(wall).as_dict(), "client_cpu_ms": mean_ci(cpu).as_dict()}
        if bare is not None:
            row["vs"] = bare
            row["wall_ratio"] = mean_ci(wall / np.array([x[0] for x in got[bare]])).as_dict()
            row["cpu_ratio"] = mean_ci(cpu / np.array([x[1] for x in got[bare]])).as_dict()
        rows[name] = row
    rec = {"machine": machine_info(), "rounds": rounds, "calls": calls, "lengths": LENGTHS, "clients": rows}
    (out / "client_cost.json").write_text(json.dumps(rec, indent=1))
    (out / "client_cost.md").write_text(markdown(rec))
    return rec


def _f(ci: dict, digits: int = 2) -> str:
    return f"{ci['mean']:.{digits}f} ± {ci['half_width']:.{digits}f}"


def markdown(rec: dict) -> str:
    lines = [f"Client cost at one in flight, one sequence a call ({rec['calls']} calls a round, {rec['rounds']} rounds, "
             f"lengths {rec['lengths']}); CPU: {rec['machine']['cpu']} x {rec['machine']['cores']}. Mean ± 95% interval over rounds.", "",
             "| client | server | wall ms a call | client CPU ms a call | against | wall ratio | CPU ratio |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rec["clients"].items():
        vs = (f"{r['vs']} | {_f(r['wall_ratio'], 3)} | {_f(r['cpu_ratio'], 3)}" if "vs" in r else "| |")
        lines.append(f"| {name} | {r['kind']} | {_f(r['wall_ms'])} | {_f(r['client_cpu_ms'])} | {vs} |")
    return "\n".join(lines) + "\n"
