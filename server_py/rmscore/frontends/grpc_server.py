"""The Python gRPC front end (grpc.aio): proto <-> ScoringCore, ScoreError -> status code."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import traceback

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from google.protobuf.message import DecodeError
from prometheus_client import start_http_server

from rmscore.core.admission import CALLER
from rmscore.core.config import ServeConfig
from rmscore.core.errors import UNAUTHENTICATED_MESSAGE, Code, ScoreError, bearer_matches
from rmscore.core.liveness import LIVENESS_SERVICE
from rmscore.v1 import reward_pb2, reward_pb2_grpc  # the server's own stubs (scripts/gen_proto.sh, setup.py)
from rmscore.core.validation import SeqInput
from rmscore.core.scoring import SERVING, ScoringCore
from rmscore.frontends.process import exit_code, write_port_file
from rmscore.frontends.drain import Drain
from rmscore.frontends import reflection_v1
from rmscore.frontends.memory import note_request_bytes, start_trimming
from rmscore.frontends.model_info import model_info
from rmscore.runtimes.workers import RUNTIME

SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardModel"].full_name
TRUNC = {reward_pb2.TRUNCATION_NONE: "none", reward_pb2.TRUNCATION_LEFT: "left",
         reward_pb2.TRUNCATION_RIGHT: "right"}


class Malformed:
    """What a request that does not parse becomes: grpc would answer UNKNOWN (a DecodeError raised in
    its deserializer) and, in a stream, stop reading and stall; the contract says INVALID_ARGUMENT."""

    def __init__(self, message_type):
        self.message = f"request: malformed {message_type.DESCRIPTOR.name}: the bytes do not parse as protobuf"


def _lenient(message_type):
    def parse(data: bytes):
        note_request_bytes(len(data))
        try:
            return message_type.FromString(data)
        except DecodeError:
            return Malformed(message_type)
    return parse


def add_servicer(servicer, server) -> None:
    """reward_pb2_grpc.add_RewardModelServicer_to_server, with deserializers that never raise."""
    handlers = {
        "Score": grpc.unary_unary_rpc_method_handler(
            servicer.Score, request_deserializer=_lenient(reward_pb2.ScoreRequest),
            response_serializer=reward_pb2.ScoreResponse.SerializeToString),
        "ScoreStream": grpc.stream_stream_rpc_method_handler(
            servicer.ScoreStream, request_deserializer=_lenient(reward_pb2.ScoreStreamRequest),
            response_serializer=reward_pb2.ScoreStreamResponse.SerializeToString),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetModelInfo, request_deserializer=reward_pb2.GetModelInfoRequest.FromString,
            response_serializer=reward_pb2.ModelInfo.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def seq_input(seq: reward_pb2.Sequence) -> SeqInput:
    kind = seq.WhichOneof("input")
    if kind == "tokens":
        return SeqInput(tokens=seq.tokens.ids)
    if kind == "text":
        return SeqInput(text=(seq.text.prompt, seq.text.response))
    return SeqInput()


def _timings(r) -> reward_pb2.Timings:
    return reward_pb2.Timings(total_ms=r.total_ms, inference_ms=r.inference_ms, queue_ms=r.queue_ms)


def _deadline(context) -> float | None:
    left = context.time_remaining()
    return None if left is None else time.monotonic() + left


# gRPC cancels a call when its deadline passes, and an answer written then never reaches the client: a
# stream's items still owed are answered this long before it (a tenth of the call's time, at most
# 0.25 s), each DEADLINE_EXCEEDED with this message, so a client can tell every item scored from every
# item not. server_cpp/src/score_stream.cc holds the same bound and words.
ANSWER_MARGIN_MAX_S = 0.25
STREAM_DEADLINE_MESSAGE = "deadline exceeded before scoring: the stream's deadline is near"


def _answer_by(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return deadline - min(ANSWER_MARGIN_MAX_S, max(0.0, deadline - time.monotonic()) / 10)


async def _by(awaitable, answer_by: float | None):
    """`awaitable`'s result, or DEADLINE_EXCEEDED (STREAM_DEADLINE_MESSAGE) once `answer_by` passes:
    the item is then cancelled, which takes it off the queue (or ignores its running batch's score)."""
    if answer_by is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, answer_by - time.monotonic())
    except asyncio.TimeoutError:
        raise ScoreError(Code.DEADLINE_EXCEEDED, STREAM_DEADLINE_MESSAGE) from None


class RewardModelServicer(reward_pb2_grpc.RewardModelServicer):
    def __init__(self, core: ScoringCore, max_stream_items_in_flight: int = 32):
        self.core = core
        self.max_stream_items_in_flight = max_stream_items_in_flight

    async def Score(self, request, context):
        t0 = time.perf_counter()
        if isinstance(request, Malformed):
            self.core.metrics.request(Code.INVALID_ARGUMENT.name, time.perf_counter() - t0)
            await context.abort(Code.INVALID_ARGUMENT.grpc, request.message)
        deadline = _deadline(context)
        CALLER.set(context.peer())  # this call's task: its connection's turns and share (core/admission.py)
        try:
            # One call into the core, which checks admission before it validates anything (seq_input
            # only wraps each message's ids, without copying). An unknown enum number goes through as
            # itself, for the validator to refuse.
            result = await self.core.score([seq_input(s) for s in request.sequences],
                                           TRUNC.get(request.truncation, request.truncation), deadline)
        except ScoreError as e:
            self.core.metrics.request(e.code.name, time.perf_counter() - t0)
            await context.abort(e.code.grpc, e.message)
        self.core.metrics.request("OK", time.perf_counter() - t0)
        return reward_pb2.ScoreResponse(scores=result.scores, model_version=self.core.repo.version,
                                        timings=_timings(result))

    async def ScoreStream(self, request_iterator, context):
        """Each item is scored on its own task; answers go out as soon as each is ready. At most
        max_stream_items_in_flight items are scored or unsent at once: at the bound the reader stops
        reading, so HTTP/2 flow control holds the client back, and one stream cannot fill the shared
        queue (a flooding stream made 41 of 43 other callers fail before this bound)."""
        answers: asyncio.Queue = asyncio.Queue()
        slots = asyncio.Semaphore(self.max_stream_items_in_flight)
        deadline = _answer_by(_deadline(context))  # admission and the items' own deadline use it
        # A stream is its connection's caller, as its calls are (core/admission.py): the item tasks
        # started below inherit it.
        CALLER.set(context.peer())
        tasks: set[asyncio.Task] = set()

        async def one(item: reward_pb2.ScoreStreamRequest) -> None:
            t0 = time.perf_counter()
            try:
                # Text is tokenized on the core's pool, never on this loop (core/tokenizing.py); the item's
                # bytes count against --max-queued-request-bytes until it is answered.
                r = await _by(self.core.score_item(seq_input(item.sequence), TRUNC.get(item.truncation, item.truncation),
                                                   "sequence", deadline), deadline)
                resp = reward_pb2.ScoreStreamResponse(id=item.id, score=r.scores[0], timings=_timings(r),
                                                      model_version=self.core.repo.version)
                code = "OK"
            except Exception as e:  # noqa: BLE001 - every item gets its one answer, a fault's included
                if not isinstance(e, ScoreError):
                    # Unanswered, the item's failure ended the reader without its end marker, and the
                    # stream hung until the client's deadline.
                    print(f"rmscore: stream item {item.id!r} failed:", file=sys.stderr, flush=True)
                    traceback.print_exc()
                    e = ScoreError(Code.INTERNAL, f"internal error: {type(e).__name__}: {e}")
                resp = reward_pb2.ScoreStreamResponse(
                    id=item.id, error=reward_pb2.Error(code=e.code.number, message=e.message),
                    model_version=self.core.repo.version)
                code = e.code.name
            self.core.metrics.request(code, time.perf_counter() - t0)
            await answers.put(resp)

        async def reader() -> None:
            async for item in request_iterator:
                await slots.acquire()  # released once its answer is sent
                if isinstance(item, Malformed):  # no id to answer it by: the call ends, saying why
                    await answers.put(item)
                    return
                t = asyncio.create_task(one(item))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks))
            await answers.put(None)

        read_task = asyncio.create_task(reader())
        try:
            while (resp := await answers.get()) is not None:
                if isinstance(resp, Malformed):
                    self.core.metrics.request(Code.INVALID_ARGUMENT.name, 0.0)
                    await context.abort(Code.INVALID_ARGUMENT.grpc, resp.message)
                yield resp
                slots.release()
        finally:
            # The client went away (or the stream ended): drop whatever it still had queued.
            read_task.cancel()
            for t in list(tasks):
                t.cancel()

    async def GetModelInfo(self, request, context):
        return reward_pb2.ModelInfo(**model_info(self.core), tokenizer_json=self.core.tokenizer_json)


class TokenCheck(grpc.aio.ServerInterceptor):
    """`authorization: Bearer <token>` on every call but grpc.health.v1.Health (probes send none);
    reflection included, as in the C++ server, where gRPC core checks it before any service."""

    def __init__(self, token: str, core: ScoringCore):
        self.token, self.core = token, core

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        if details.method.startswith(f"/{health.SERVICE_NAME}/"):
            return await continuation(details)
        given = [v for k, v in details.invocation_metadata or () if k == "authorization"]
        if bearer_matches(given, self.token):
            return await continuation(details)  # an unknown method is UNIMPLEMENTED only for a caller with the token
        self.core.metrics.request(Code.UNAUTHENTICATED.name, 0.0)
        return _REFUSAL


async def _refuse(_requests, context) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


# Every refused call, unary or streaming, known method or not, takes a streaming handler without a
# deserializer that never reads its request iterator, so nothing of the body is parsed: with the
# method's own unary handler gRPC deserialized the message before the refusal ran. An unknown method
# answered UNIMPLEMENTED before the token was checked. The C++ server checks the token in gRPC core,
# before any service (service.cc, CheckToken).
_REFUSAL = grpc.stream_stream_rpc_method_handler(_refuse)


#: A client may PING at most this often with no call open; the third ping sooner than that gets a GOAWAY
#: (ENHANCE_YOUR_CALM). gRPC's own server defaults, set here so that they are stated and the C++ server
#: can match them.
MIN_PING_INTERVAL_WITHOUT_DATA_MS = 300_000
MAX_PING_STRIKES = 2
#: Streams of one connection whose calls have ended but that the server has not let go of yet, per
#: stream the limit allows, before new streams are refused (transport_limit_options).
DEALLOCATING_STREAMS_PER_STREAM = 10


def transport_limit_options(cfg: ServeConfig) -> list[tuple[str, int]]:
    """The gRPC channel arguments of the transport limits (docs/hardening.md, "Transport attacks (Python)")."""
    # No compressed requests, as in the C++ server: gRPC inflates a message whole before comparing it
    # with the receive limit (a 1 MiB gzip bomb took C++ to +1 GiB), so the contract is identity only,
    # and a compressed request is refused UNIMPLEMENTED at its headers on every kind (bit 0: identity).
    # The stream limit is advertised in SETTINGS, so a client's calls over it wait in the client. gRPC's
    # overload protection also counts a stream the client has seen end until this server has let go of
    # its call; past the limit it refuses new streams REFUSED_STREAM, which grpcio does not retry
    # (UNAVAILABLE "Stream removed"). With no allowance for such streams, 95-133 of 300 calls started
    # at once on a fresh channel were refused. The allowance keeps the protection for what it is for:
    # streams opened and reset at once (50,000: 0.24 CPU-s, 40,000 of them refused; without the
    # protection 1.2 CPU-s). docs/contract.md, "Streams per connection"; tests/conformance/test_stream_limit.py.
    limit = cfg.max_concurrent_streams
    return [("grpc.compression_enabled_algorithms_bitset", 1),
            ("grpc.max_concurrent_streams", limit),
            ("grpc.http.overload_protection", 1),
            ("grpc.http2.max_deallocating_streams", min(DEALLOCATING_STREAMS_PER_STREAM * limit, 2**31 - 1)),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_WITHOUT_DATA_MS),
            ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES)]


async def serve(cfg: ServeConfig) -> int:
    core = ScoringCore(cfg, RUNTIME)
    limit = cfg.max_request_bytes
    interceptors = [TokenCheck(cfg.auth_token, core)] if cfg.auth_token else []
    server = grpc.aio.server(interceptors=interceptors, options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", max(limit, 64 << 20)),
                                      ("grpc.so_reuseport", 0), *cfg.connection_age_options,
                                      *transport_limit_options(cfg)])
    add_servicer(RewardModelServicer(core, cfg.max_stream_items_in_flight), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection_v1.enable((SERVICE, health.SERVICE_NAME), server)
    address = f"{cfg.host}:{cfg.port}"
    if cfg.tls:
        creds = grpc.ssl_server_credentials([(cfg.tls_key_file.read_bytes(), cfg.tls_cert_file.read_bytes())])
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        print(f"rmscore serve: cannot bind {cfg.host}:{cfg.port}", flush=True)
        return 1
    metrics_server, _ = start_http_server(cfg.metrics_port, addr=cfg.host, registry=core.metrics.registry)
    await server.start()
    # freed request buffers go back to the system (frontends/memory.py)
    start_trimming(pin_threshold=cfg.backend == "onnxruntime")

    loop = asyncio.get_running_loop()
    failed = asyncio.Event()

    async def set_health(state: str) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if state == SERVING else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await health_servicer.set(name, status)
        if state == "failed":
            failed.set()

    await set_health("warming_up")
    # "liveness" (docs/contract.md): SERVING while the process runs and its batcher makes progress,
    # warming up and draining included; NOT_SERVING while the batcher is stalled past
    # --liveness-stall-seconds. The liveness watch's thread reports each change; Check and Watch
    # answer from the status set here, on this loop, which a stuck batcher thread does not block.
    await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    def on_liveness(alive: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if alive else health_pb2.HealthCheckResponse.NOT_SERVING
        # Raises RuntimeError once the loop is closed (the process is ending): the watch logs it.
        asyncio.run_coroutine_threadsafe(health_servicer.set(LIVENESS_SERVICE, status), loop)

    write_port_file(cfg.port_file, port, metrics_server.server_port)
    core.start_loading(lambda s: asyncio.run_coroutine_threadsafe(set_health(s), loop), on_liveness)

    stop = asyncio.Event()
    drain = Drain(core)

    async def not_serving_then_refuse() -> None:
        # Health says NOT_SERVING before the first call is refused (docs/hardening.md, drain). The
        # servicer's set() takes an uncontended asyncio lock: no Score call runs in between.
        await set_health("draining")
        core.begin_drain()

    def on_signal() -> None:
        if drain.signal():
            loop.create_task(not_serving_then_refuse())
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    done, _ = await asyncio.wait([asyncio.create_task(stop.wait()), asyncio.create_task(failed.wait())],
                                 return_when=asyncio.FIRST_COMPLETED)
    if failed.is_set() and not stop.is_set():
        core.stop(0.0)  # no batcher: ends the liveness watch, whose reports need this loop
        await server.stop(0)
        metrics_server.shutdown()
        return 1
    # Drain: NOT_SERVING, new work refused (on_signal), finish what was accepted, then go.
    await not_serving_then_refuse()  # already done by on_signal's task, unless the warm-up failed first
    # Then gRPC closes the calls still open within what is left of the reserve.
    await server.stop(grace=await asyncio.to_thread(drain.finish))
    metrics_server.shutdown()
    drain.report()
    return exit_code(core, 0)


def run(cfg: ServeConfig) -> int:
    return asyncio.run(serve(cfg))


__all__ = ["run", "Code"]
