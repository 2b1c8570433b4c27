"""How the load generators talk to a server: through `rmscore_client`.

`async_client(transport, target, chunk_size=...)` gives the rmscore client's
`AsyncRewardClient` (gRPC) or `AsyncHttpRewardClient` (FastAPI), configured for
measuring: no retries (an overloaded server must show up as failures, not as
slow successes), a fixed chunk size, and no client-side cap on chunks in
flight. `score_ids(seqs, on_chunk=...)` sends every chunk of `seqs` at once and
reports each chunk's client-side latency (`ChunkTiming`).

If `rmscore_client` is not importable, a minimal local adapter with the same
interface stands in (one `Score` RPC or `POST /v1/score` per chunk, all chunks
concurrently). `implementation()` says which one is in use; every report
records it.

`GeventGrpcClient` is for Locust only: the rmscore client's gRPC path is
built on `grpc.aio`, which never completes a call in a gevent-monkey-patched
process (checked with grpcio 1.85: even a bare `grpc.aio` `Score` hangs), so
Locust's gRPC users send each chunk with grpc's blocking stub, made
gevent-cooperative by `grpc.experimental.gevent.init_gevent()`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field

TRANSPORTS = ("grpc", "http")
DEFAULT_TIMEOUT_S = 120.0
UNLIMITED_CONCURRENCY = 4096


def _real_client():
    try:
        import rmscore_client as client
    except ImportError:
        return None
    return client if hasattr(client, "AsyncRewardClient") else None


def implementation() -> str:
    return "rmscore_client" if _real_client() is not None else "local adapter (rmscore_loadtest.caller)"


def _check(transport: str) -> None:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")


@dataclass(frozen=True)
class Timing:
    """Mirror of rmscore_client.ChunkTiming for the local adapter."""

    offset: int
    count: int
    latency_ms: float
    attempts: int = 1
    model_version: str = ""
    total_ms: float = float("nan")
    inference_ms: float = float("nan")
    queue_ms: float = float("nan")


@dataclass
class Result:
    scores: list[float]
    model_version: str = ""
    timings: list = field(default_factory=list)


def request_pb(seqs: list[list[int]]):
    from rmscore_client.v1 import reward_pb2

    return reward_pb2.ScoreRequest(sequences=[reward_pb2.Sequence(tokens=reward_pb2.TokenIds(ids=s)) for s in seqs])


class _LocalAsync:
    """Stand-in for rmscore_client's asyncio clients: chunks, all in flight, one request each."""

    def __init__(self, transport: str, target: str, chunk_size: int, timeout_s: float):
        self.transport, self.chunk_size, self.timeout_s = transport, chunk_size, timeout_s
        if transport == "grpc":
            import grpc
            from rmscore_client.v1 import reward_pb2_grpc

            self._channel = grpc.aio.insecure_channel(target)
            self._stub = reward_pb2_grpc.RewardModelStub(self._channel)
        else:
            import httpx

            self._http = httpx.AsyncClient(base_url=target, timeout=timeout_s,
                                           limits=httpx.Limits(max_connections=512, max_keepalive_connections=512))

    async def _once(self, part):
        if self.transport == "grpc":
            r = await self._stub.Score(request_pb(part), timeout=self.timeout_s)
            t = r.timings
            return list(r.scores), r.model_version, (t.total_ms, t.inference_ms, t.queue_ms)
        resp = await self._http.post("/v1/score", json={"sequences": [{"tokens": s} for s in part]})
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        body = resp.json()
        t = body["timings"]
        return list(body["scores"]), body["model_version"], (t["total_ms"], t["inference_ms"], t["queue_ms"])

    async def score_ids(self, seqs, *, on_chunk=None, **_):
        async def one(lo):
            part = seqs[lo:lo + self.chunk_size]
            t0 = time.perf_counter()
            scores, version, server = await self._once(part)
            timing = Timing(lo, len(part), (time.perf_counter() - t0) * 1e3, 1, version, *server)
            if on_chunk is not None:
                on_chunk(timing)
            return scores, timing

        parts = await asyncio.gather(*(one(lo) for lo in range(0, len(seqs), self.chunk_size)))
        return Result([s for p, _ in parts for s in p], parts[0][1].model_version if parts else "",
                      [t for _, t in parts])

    async def close(self):
        if self.transport == "grpc":
            await self._channel.close()
        else:
            await self._http.aclose()


def async_client(transport: str, target: str, chunk_size: int = 8, timeout_s: float = DEFAULT_TIMEOUT_S):
    """An asyncio client for measuring: `await c.score_ids(seqs, on_chunk=f)`, `await c.close()`."""
    _check(transport)
    real = _real_client()
    if real is None:
        return _LocalAsync(transport, target, chunk_size, timeout_s)
    cls = real.AsyncRewardClient if transport == "grpc" else real.AsyncHttpRewardClient
    wanted = {"chunk_size": chunk_size, "max_concurrency": UNLIMITED_CONCURRENCY, "timeout_s": timeout_s,
              "retry": getattr(real, "NO_RETRY", None)}
    params = inspect.signature(cls).parameters
    takes_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kw = {k: v for k, v in wanted.items() if v is not None and (k in params or takes_kw)}
    return cls(target, **kw)


async def aclose(client) -> None:
    r = client.close()
    if inspect.isawaitable(r):
        await r


class GeventGrpcClient:
    """One blocking `Score` RPC per call; cooperative under gevent once init_gevent() ran (Locust)."""

    def __init__(self, target: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        import grpc
        from rmscore_client.v1 import reward_pb2_grpc

        self._channel = grpc.insecure_channel(target)
        self._stub = reward_pb2_grpc.RewardModelStub(self._channel)
        self._timeout = timeout_s

    def score_ids(self, seqs) -> Result:
        r = self._stub.Score(request_pb(seqs), timeout=self._timeout)
        return Result(list(r.scores), r.model_version)

    def close(self) -> None:
        self._channel.close()
