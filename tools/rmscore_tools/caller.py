"""The one way to call any server kind over either transport, built on rmscore_client and its stubs.

* `async_client(transport, target, chunk_size=...)`: the rmscore client's `AsyncRewardClient`
  (gRPC) or `AsyncHttpRewardClient` (FastAPI), configured for measuring: no retries (an overloaded
  server must show up as failures, not as slow successes), a fixed chunk size, and no client-side
  cap on chunks in flight; over HTTP, idle connections expire before the server's keep-alive
  closes them (KEEPALIVE_EXPIRY_S). The load generator (loadgen.py) drives it.
* `Caller(transport, target)` (or `Caller.to(server)`): blocking, one request per call, nothing
  added: no chunking, no retries. Requests are portable dicts ({"tokens": [...]},
  {"prompt": .., "response": ..}, {}), and every refusal comes back as `CallError(code name,
  message)` whatever the transport, so one assertion covers gRPC and HTTP alike. It also sends
  what no client would: raw bytes as a `Score` / `ScoreStream` body, any HTTP method, body and
  headers (`http`); that is what the conformance suite, the hostile-input corpus and the fault
  probes need.
* `GeventGrpcClient` is for Locust only: the rmscore client's gRPC path is built on `grpc.aio`,
  which never completes a call in a gevent-monkey-patched process (checked with grpcio 1.85: even a
  bare `grpc.aio` `Score` hangs), so Locust's gRPC users send each chunk through a `Caller`, whose
  blocking stub `grpc.experimental.gevent.init_gevent()` makes gevent-cooperative.

Light on import (the Locust file imports this under gevent): grpc and httpx load when a client is made.
"""

from __future__ import annotations

TRANSPORTS = ("grpc", "http")
DEFAULT_TIMEOUT_S = 120.0
UNLIMITED_CONCURRENCY = 4096
SCORE_METHOD = "/rmscore.v1.RewardModel/Score"
STREAM_METHOD = "/rmscore.v1.RewardModel/ScoreStream"


def _check(transport: str) -> None:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")


def target_of(server) -> str:
    """Where a RunningServer is reached: host:port for gRPC, its base URL for HTTP."""
    return server.target if server.transport == "grpc" else server.base_url


def http_limits(max_connections: int = 100):
    """The blocking caller's httpx pool: httpx's default sizes, with idle connections expiring before
    uvicorn's keep-alive closes them (rmscore_client.http_client.KEEPALIVE_EXPIRY_S says why)."""
    import httpx
    from rmscore_client.http_client import KEEPALIVE_EXPIRY_S

    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=20,
                        keepalive_expiry=KEEPALIVE_EXPIRY_S)


def async_client(transport: str, target: str, chunk_size: int = 8, timeout_s: float = DEFAULT_TIMEOUT_S):
    """An asyncio client for measuring: `await c.score_ids(seqs, on_chunk=f)`, `await c.close()`."""
    import rmscore_client

    _check(transport)
    cls = rmscore_client.AsyncRewardClient if transport == "grpc" else rmscore_client.AsyncHttpRewardClient
    return cls(target, chunk_size=chunk_size, max_concurrency=UNLIMITED_CONCURRENCY, timeout_s=timeout_s,
               retry=rmscore_client.NO_RETRY)


# ---- requests --------------------------------------------------------------------------------

def tokens(seqs: list[list[int]]) -> list[dict]:
    """Token-id sequences as portable requests."""
    return [{"tokens": list(s)} for s in seqs]


def to_proto(seq: dict):
    from rmscore_client.v1 import reward_pb2 as pb

    if "tokens" in seq:
        return pb.Sequence(tokens=pb.TokenIds(ids=seq["tokens"]))
    if "prompt" in seq:
        return pb.Sequence(text=pb.TextPair(prompt=seq["prompt"], response=seq["response"]))
    return pb.Sequence()


def score_request(seqs: list[dict], truncation: str = "none"):
    """The ScoreRequest of portable sequences; truncation "none" / "left" / "right"."""
    from rmscore_client.v1 import reward_pb2 as pb

    trunc = {"none": pb.TRUNCATION_NONE, "left": pb.TRUNCATION_LEFT, "right": pb.TRUNCATION_RIGHT}[truncation]
    return pb.ScoreRequest(sequences=[to_proto(s) for s in seqs], truncation=trunc)


# ---- the blocking caller ---------------------------------------------------------------------

class CallError(Exception):
    """A refused call: the contract's code name ("INVALID_ARGUMENT", ...) and the server's message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class Caller:
    """One request per call to one server, either transport; see the module docstring."""

    def __init__(self, transport: str, target: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_message_bytes: int = 64 << 20):
        _check(transport)
        self.transport, self.target, self.timeout_s = transport, target, timeout_s
        self.grpc = transport == "grpc"
        if self.grpc:
            import grpc

            from rmscore_client.v1 import reward_pb2 as pb, reward_pb2_grpc as pbg

            self._pb = pb
            # A plain channel: no client-side health checking or retries, so refusals are the server's own.
            self.channel = grpc.insecure_channel(target, options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes)])
            self.stub = pbg.RewardModelStub(self.channel)
        else:
            import httpx

            self.http_client = httpx.Client(base_url=target, timeout=timeout_s, limits=http_limits())

    @classmethod
    def to(cls, server, **kw) -> "Caller":
        return cls(server.transport, target_of(server), **kw)

    # -- scoring
    def score(self, seqs: list[dict], truncation: str = "none", timeout_s: float | None = 120) -> list[float]:
        return self.score_full(seqs, truncation, timeout_s)["scores"]

    def score_ids(self, seqs: list[list[int]], timeout_s: float | None = None):
        """Token-id sequences; an rmscore_client ScoreResult (scores, model_version)."""
        from rmscore_client import ScoreResult

        r = self.score_full(tokens(seqs), timeout_s=timeout_s or self.timeout_s)
        return ScoreResult(r["scores"], r["model_version"])

    def score_full(self, seqs: list[dict], truncation: str = "none", timeout_s: float | None = 120) -> dict:
        """{"scores", "model_version", "timings": {"total_ms", "inference_ms", "queue_ms"}}."""
        if self.grpc:
            r = self.score_pb(score_request(seqs, truncation), timeout_s)
            return {"scores": list(r.scores), "model_version": r.model_version,
                    "timings": {"total_ms": r.timings.total_ms, "inference_ms": r.timings.inference_ms,
                                "queue_ms": r.timings.queue_ms}}
        body = {"sequences": seqs, "truncation": truncation}
        if timeout_s is not None and timeout_s < 60:
            body["timeout_ms"] = timeout_s * 1000
        # The server's deadline starts once it has the body, after the client's clock: the client waits
        # 2 s longer, so the answer to a request that runs out its deadline is the server's
        # DEADLINE_EXCEEDED, not the client's own read timeout racing it.
        return self.post(body, timeout_s=max((timeout_s or 120) + 2, 10))

    def score_pb(self, request, timeout_s: float | None = None):
        """gRPC Score with a ScoreRequest, or with raw bytes sent as they are; the ScoreResponse."""
        import grpc

        timeout_s = timeout_s if timeout_s is not None else self.timeout_s
        try:
            if isinstance(request, bytes):
                raw = self.channel.unary_unary(SCORE_METHOD)(request, timeout=timeout_s)  # bytes in, bytes out
                return self._pb.ScoreResponse.FromString(raw)
            return self.stub.Score(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise CallError(e.code().name, e.details() or "") from None

    def stream(self, items: list, timeout_s: float | None = None) -> list:
        """gRPC ScoreStream: every item sent, every answer read. ScoreStreamRequests give
        ScoreStreamResponses; raw bytes items give raw bytes answers."""
        import grpc

        timeout_s = timeout_s if timeout_s is not None else self.timeout_s
        raw = bool(items) and all(isinstance(x, bytes) for x in items)
        call = self.channel.stream_stream(STREAM_METHOD) if raw else self.stub.ScoreStream
        try:
            return list(call(iter(items), timeout=timeout_s))
        except grpc.RpcError as e:
            raise CallError(e.code().name, e.details() or "") from None

    def post(self, body, raw: bytes | None = None, timeout_s: float = 120) -> dict:
        """HTTP POST /rmscore/v1/score of a JSON body (or raw bytes as JSON); the answer, or CallError."""
        import httpx

        try:
            r = (self.http("POST", "/rmscore/v1/score", raw, timeout_s=timeout_s) if raw is not None
                 else self.http_client.post("/rmscore/v1/score", json=body, timeout=timeout_s))
        except httpx.ConnectError as e:  # what gRPC calls UNAVAILABLE
            raise CallError("UNAVAILABLE", str(e)) from None
        if r.status_code != 200:
            err = r.json()["error"]
            raise CallError(err["code"], err["message"])
        return r.json()

    def http(self, method: str, path: str, content=None, headers: dict | None = None,
             timeout_s: float | None = None):
        """Any HTTP request, the httpx Response as it is: content-type JSON unless `headers` say
        otherwise (an empty value drops the header)."""
        h = {k: v for k, v in {"content-type": "application/json", **(headers or {})}.items() if v}
        return self.http_client.request(method, path, content=content, headers=h,
                                        timeout=timeout_s if timeout_s is not None else self.timeout_s)

    # -- model and health
    def info(self, timeout_s: float = 10) -> dict:
        if self.grpc:
            m = self.stub.GetModelInfo(self._pb.GetModelInfoRequest(), timeout=timeout_s)
            return {f.name: getattr(m, f.name) for f in m.DESCRIPTOR.fields}
        return self.http_client.get("/v1/model", timeout=timeout_s).json()

    def is_serving(self, timeout_s: float = 5) -> bool | None:
        """True/False from the health service (gRPC) or /readyz (HTTP); None when nothing answered."""
        try:
            if self.grpc:
                from grpc_health.v1 import health_pb2, health_pb2_grpc

                r = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                   timeout=timeout_s)
                return r.status == health_pb2.HealthCheckResponse.SERVING
            return self.http_client.get("/readyz", timeout=timeout_s).status_code == 200
        except Exception:  # noqa: BLE001 - any failure to answer is "no answer"
            return None

    def close(self) -> None:
        self.channel.close() if self.grpc else self.http_client.close()


class GeventGrpcClient(Caller):
    """One blocking `Score` RPC per call; cooperative under gevent once init_gevent() ran (Locust)."""

    def __init__(self, target: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__("grpc", target, timeout_s=timeout_s)
