"""The FastAPI front end: JSON <-> ScoringCore, ScoreError -> HTTP status, on uvicorn."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from rmscore.core.config import ServeConfig
from rmscore.core.errors import UNAUTHENTICATED_MESSAGE, Code, ScoreError, bearer_matches
from rmscore.core.liveness import now_us
from rmscore.core.validation import SeqInput
from rmscore.frontends import json_body, openrlhf, reward_text, vllm_api
from rmscore.core.scoring import SERVING, ScoringCore
from rmscore.frontends.process import exit_code, write_port_file
from rmscore.frontends.drain import Drain
from rmscore.frontends.http_protocol import with_header_deadline
from rmscore.frontends.http_errors import VLLM_PATHS, error_response, refusal, vllm_error_response
from rmscore.frontends.memory import start_trimming
from rmscore.frontends.model_info import model_info
from rmscore.runtimes.workers import RUNTIME


class SequenceIn(BaseModel):
    """One sequence: `tokens` (ids) or `prompt` + `response` (text)."""

    model_config = ConfigDict(extra="forbid")
    # Strict: "101", 101.0 and true are not token ids (lax mode read them as 101, 101, 1).
    tokens: list[StrictInt] | None = None
    prompt: str | None = None
    response: str | None = None


class ScoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sequences: list[SequenceIn]
    truncation: Literal["none", "left", "right"] = "none"
    timeout_ms: float | None = Field(default=None, gt=0, description="deadline for this request")


class TimingsOut(BaseModel):
    total_ms: float
    inference_ms: float
    queue_ms: float


class ScoreOut(BaseModel):
    scores: list[float]
    model_version: str
    timings: TimingsOut


def _seq_input(s: SequenceIn) -> SeqInput:
    # Both kept when both are sent: the validator refuses that rather than letting tokens win.
    text = (s.prompt or "", s.response or "") if s.prompt is not None or s.response is not None else None
    return SeqInput(tokens=s.tokens, text=text)


#: rmscore's own scoring route; /v1/score, its path until 0.1, is vLLM's score route (vllm_api.py).
SCORE_PATH = "/rmscore/v1/score"

# A deadline further away than this is no deadline (1e308 ms overflowed asyncio's timer: a 500).
NO_DEADLINE_MS = 365 * 24 * 3600 * 1e3


def _drop_tracebacks(exc: BaseException) -> None:
    """FastAPI's body reading ends in `raise http_error from e`, a reference cycle (the raising frame
    holds http_error); through its cause's traceback the cycle held the partial body of a client that
    went away or stalled (up to max_request_bytes each) until a full garbage collection, which an idle
    server may not run for minutes: 40 stalled 15 MiB bodies left +12 % resident (docs/hardening.md, "Transport attacks (Python)"). The
    answer is made; the frames are not needed."""
    for _ in range(8):  # the chain is short; bounded all the same
        if exc is None:
            return
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def create_app(core: ScoringCore, chat_template=None) -> FastAPI:
    """The FastAPI app over `core`; `chat_template`: the compiled --chat-template of the framework routes."""
    app = FastAPI(title="rmscore", description="Reward-model scoring (same contract as the gRPC servers)")
    app.router.route_class = json_body.route_class()  # large bodies decode off the event loop

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError):
        core.metrics.request(Code.INVALID_ARGUMENT.name, None)
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            reason = (first.get("ctx") or {}).get("error", first["msg"])
            where, message = "body", f"body: malformed JSON at character {first['loc'][-1]}: {reason}"
        else:
            where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
            message = f"{where}: {first['msg']}"
        if request.url.path in VLLM_PATHS:  # vLLM's validation handler: 400 "Bad Request", the field as param
            return vllm_error_response(Code.INVALID_ARGUMENT, message, param=where, type_="Bad Request")
        return error_response(Code.INVALID_ARGUMENT, message)

    @app.exception_handler(StarletteHTTPException)
    async def undecodable(request: Request, exc: StarletteHTTPException):
        # FastAPI answers 400 {"detail": ...} to a body json.loads cannot decode at all
        # (not UTF-8, nested too deeply); the contract's answer to malformed JSON is 422.
        if exc.status_code != 400:
            return await http_exception_handler(request, exc)
        _drop_tracebacks(exc)
        core.metrics.request(Code.INVALID_ARGUMENT.name, None)
        cause = exc.__cause__
        reason = ("not UTF-8 text" if isinstance(cause, UnicodeDecodeError) else
                  "nested too deeply" if isinstance(cause, RecursionError) else exc.detail)
        if request.url.path in VLLM_PATHS:
            return vllm_error_response(Code.INVALID_ARGUMENT, f"body: malformed JSON: {reason}", param="body",
                                       type_="Bad Request")
        return error_response(Code.INVALID_ARGUMENT, f"body: malformed JSON: {reason}")

    @app.post(SCORE_PATH, response_model=ScoreOut)
    async def score(body: ScoreIn):
        t0 = time.perf_counter()
        if body.timeout_ms is not None and body.timeout_ms > NO_DEADLINE_MS:  # as the C++ server reads it
            body.timeout_ms = None
        deadline = None if body.timeout_ms is None else time.monotonic() + body.timeout_ms / 1e3
        try:
            core.check_admission(deadline)  # before the inputs are built; core.score asks again (cheap)
            if deadline is None:
                r = await core.score([_seq_input(s) for s in body.sequences], body.truncation, None)
            else:
                r = await asyncio.wait_for(
                    core.score([_seq_input(s) for s in body.sequences], body.truncation, deadline),
                    body.timeout_ms / 1e3)
        except ScoreError as e:
            return refusal(core, e, t0)
        except asyncio.TimeoutError:
            return refusal(core, ScoreError(Code.DEADLINE_EXCEEDED, "deadline exceeded before scoring"), t0)
        core.metrics.request("OK", time.perf_counter() - t0)
        return {"scores": r.scores, "model_version": core.repo.version,
                "timings": {"total_ms": r.total_ms, "inference_ms": r.inference_ms, "queue_ms": r.queue_ms}}

    @app.get("/v1/model")
    async def model():
        return model_info(core)

    @app.get("/v1/tokenizer")
    async def tokenizer():
        return Response(core.tokenizer_json, media_type="application/json")

    @app.get("/healthz")
    async def healthz():
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz():
        ok = core.state == SERVING
        return JSONResponse({"status": core.state}, status_code=200 if ok else 503)

    @app.get("/livez")
    async def livez():
        # Judged now, from the stall clock alone (core/liveness.py): answered on the event loop
        # while a batcher thread is stuck. 503 once the batcher made no progress with work waiting
        # for longer than --liveness-stall-seconds; 200 otherwise, warming up and draining included.
        alive, stall = core.liveness.check(now_us())
        return JSONResponse({"status": "alive" if alive else "stalled", "stalled_seconds": stall.stalled_us / 1e6,
                             "liveness_stall_seconds": core.liveness.threshold_s},
                            status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    register_framework_routes(app, core, chat_template)
    return app


def register_framework_routes(app: FastAPI, core: ScoringCore, chat_template=None) -> None:
    """The routes trainers' own clients speak (docs/frameworks/): OpenRLHF's POST /get_reward and
    vLLM's pooling API (POST /classify, /score, /rerank, /pooling, ...: vllm_api.py), beside rmscore's own."""
    encoder = reward_text.Encoder(core.tokenizer_json, core.repo.max_sequence_length, core.cfg.strip_strings,
                                  chat_template, core.max_text_chars)
    openrlhf.register(app, core, encoder)
    vllm_api.register(app, core, encoder)


class _BodyTooLarge(Exception):
    pass


class _LimitBody:
    """ASGI middleware: refuse bodies over max_request_bytes with 413 before parsing them, by
    Content-Length, or, for a chunked body, by the bytes read so far (it was read and parsed whole)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _refuse(self, what: str) -> JSONResponse:
        return error_response(Code.RESOURCE_EXHAUSTED, f"body of {what} bytes exceeds max_request_bytes {self.limit}",
                              status=413)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and int(length) > self.limit:
            return await self._refuse(str(int(length)))(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message):
            if seen <= self.limit:  # the app's own answer to the aborted read is replaced below
                await send(message)

        try:
            await self.app(scope, counted, guarded_send)
        except _BodyTooLarge:
            pass
        if seen > self.limit:
            await self._refuse(f"more than {seen}")(scope, receive, send)


class _OneFraming:
    """ASGI middleware: a request with both Content-Length and Transfer-Encoding is answered 400 and
    its connection closed (RFC 9112 6.3: a server may not trust either length then, and what follows
    on the connection may be a smuggled request). h11 accepts a well-chunked such body and served the
    bytes after it as a second request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            names = {k for k, _ in scope.get("headers") or ()}
            if b"content-length" in names and b"transfer-encoding" in names:
                resp = error_response(Code.INVALID_ARGUMENT, "request has both Content-Length and "
                                      "Transfer-Encoding (RFC 9112 6.3): the connection is closed", status=400)
                resp.headers["Connection"] = "close"
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class _BodyRefused(Exception):
    pass


class _BodyBudget:
    """ASGI middleware: a body must arrive whole within `timeout_s` (else 408), and the bodies being
    received, summed over every connection, stay within `limit` bytes (else 413 RESOURCE_EXHAUSTED):
    40 clients each sending most of a 16 MiB body and then stalling held 650 MiB (stalled bodies, docs/hardening.md). A body's
    Content-Length is reserved before it is read; a chunked one is counted as it comes; both are
    released once the body is complete. The refused connection is closed: its body was not read."""

    def __init__(self, app, timeout_s: float, limit: int, core: ScoringCore):
        self.app, self.timeout_s, self.limit, self.core = app, timeout_s, limit, core
        self.receiving = 0  # one event loop: no lock needed

    def _refusal(self, status: int, message: str) -> JSONResponse:
        code = Code.DEADLINE_EXCEEDED if status == 408 else Code.RESOURCE_EXHAUSTED
        self.core.metrics.request(code.name, None)
        resp = error_response(code, message, status=status)
        resp.headers["Connection"] = "close"
        return resp

    def _over(self, more: int) -> str:
        return (f"request bodies being received ({self.receiving} + {more} bytes) exceed "
                f"max_buffered_request_bytes {self.limit}")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        held = int(length) if length.isdigit() else 0
        if self.receiving + held > self.limit:
            return await self._refusal(413, self._over(held))(scope, receive, send)
        self.receiving += held
        loop = asyncio.get_running_loop()
        deadline, seen, failure = loop.time() + self.timeout_s, 0, None

        async def timed():
            nonlocal held, seen, failure
            if failure is not None or deadline is None:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                failure = self._refusal(408, f"request body not received within body_timeout_seconds "
                                             f"{self.timeout_s:g} ({seen} bytes came)")
                raise _BodyRefused() from None
            seen += len(message.get("body", b""))
            if seen > held:  # chunked, or more than announced: count what came
                if self.receiving + seen - held > self.limit:
                    failure = self._refusal(413, self._over(seen - held))
                    raise _BodyRefused()
                self.receiving += seen - held
                held = seen
            if message["type"] != "http.request" or not message.get("more_body"):
                release()
            return message

        def release():
            nonlocal held, deadline
            self.receiving -= held
            held, deadline = 0, None

        async def guarded_send(message):
            if failure is None:  # the app's own answer to the aborted read is replaced below
                await send(message)

        try:
            await self.app(scope, timed, guarded_send)
        except _BodyRefused:
            pass
        finally:
            release()
        if failure is not None:
            await failure(scope, receive, send)


class _CancelOnDisconnect:
    """ASGI middleware: a client that disconnects before its answer cancels its handler, so its queued
    sequences are dropped (ScoringCore.score_ids) instead of costing model time, as the gRPC servers do
    on a cancelled call. Once the body is read, uvicorn's next receive() message is http.disconnect,
    sent when the connection is lost or the response is complete; only the former cancels."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_read = asyncio.Event()
        answered = False
        watcher: asyncio.Task | None = None

        async def watch():
            await body_read.wait()
            return await receive()

        async def app_receive():
            if body_read.is_set():  # the app listens for the end too: share the watcher's receive
                return await asyncio.shield(watcher)
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                body_read.set()
            return message

        async def app_send(message):
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered = True
            await send(message)

        watcher = asyncio.ensure_future(watch())
        handler = asyncio.ensure_future(self.app(scope, app_receive, app_send))
        try:
            await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not handler.done() and not answered and watcher.done() and not watcher.cancelled() \
                    and watcher.result()["type"] == "http.disconnect":
                handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
            if not handler.cancelled() and handler.exception() is not None:
                raise handler.exception()
        finally:
            watcher.cancel()
            handler.cancel()


class _TokenCheck:
    """ASGI middleware: `Authorization: Bearer <token>` on every path but the probes' (/healthz,
    /readyz, /livez, vLLM's /health) and /metrics (unauthenticated on every server kind: the gRPC servers serve it on
    their own metrics port). Outermost, so nothing else runs for a refused call."""

    OPEN = frozenset({"/healthz", "/readyz", "/livez", "/health", "/metrics"})

    def __init__(self, app, token: str, core: ScoringCore):
        self.app, self.token, self.core = app, token, core

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            given = [v for k, v in scope.get("headers") or () if k == b"authorization"]
            if not bearer_matches(given, self.token):
                self.core.metrics.request(Code.UNAUTHENTICATED.name, 0.0)
                resp = error_response(Code.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
                resp.headers["WWW-Authenticate"] = "Bearer"
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class _DrainingServer(uvicorn.Server):
    """On SIGTERM: report not ready and refuse new work, finish accepted work, then let uvicorn close
    (frontends/drain.py); a second signal is uvicorn's own forced exit."""

    def __init__(self, config, core: ScoringCore):
        super().__init__(config)
        self.core = core
        self.drain = Drain(core)

    def handle_exit(self, sig, frame) -> None:
        if not self.drain.signal():
            return super().handle_exit(sig, frame)
        self.core.begin_drain()  # /readyz reads the core's state: NOT_SERVING and refusing are one step

        def finish() -> None:
            # uvicorn gets only what is left of the reserve, so the exit comes within the grace.
            self.config.timeout_graceful_shutdown = self.drain.finish()
            self.drain.report()
            self.should_exit = True

        threading.Thread(target=finish, daemon=True).start()


def run(cfg: ServeConfig) -> int:
    chat_template = reward_text.chat_template(cfg)  # a bad --chat-template refuses the start before any loading
    core = ScoringCore(cfg, RUNTIME)
    app = create_app(core, chat_template)
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets whose proto says TCP, and accepted sockets inherit it. With proto 0, uvicorn's two
    # writes per response (headers, body) met the client's delayed ACK: +40 ms on every request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    port = sock.getsockname()[1]
    # Inside _LimitBody: a body over max_request_bytes is refused for that, whatever else is arriving.
    budget = _BodyBudget(_CancelOnDisconnect(app), cfg.body_timeout_seconds, cfg.max_buffered_request_bytes, core)
    asgi = _LimitBody(budget, cfg.max_request_bytes)
    if cfg.auth_token:
        asgi = _TokenCheck(asgi, cfg.auth_token, core)
    asgi = _OneFraming(asgi)  # outermost: a request whose length is in doubt goes no further
    tls = dict(ssl_certfile=str(cfg.tls_cert_file), ssl_keyfile=str(cfg.tls_key_file)) if cfg.tls else {}
    # h11, not uvicorn's "auto" (httptools wherever it is installed): the parser whose framing
    # tests/integration/test_transport_py.py checks, whatever else the venv holds; with request
    # headers due within body_timeout_seconds (frontends/http_protocol.py: uvicorn has no such timer).
    config = uvicorn.Config(asgi, log_level="warning", timeout_graceful_shutdown=int(cfg.drain_grace_seconds),
                            access_log=False, http=with_header_deadline(cfg.body_timeout_seconds), **tls)
    server = _DrainingServer(config, core)
    write_port_file(cfg.port_file, port, port)
    failed = []

    def on_state(state: str) -> None:
        if state == "failed":  # never ready: exit rather than answer 503 forever
            failed.append(state)
            server.should_exit = True

    core.start_loading(on_state)
    start_trimming()  # freed request buffers go back to the system (frontends/memory.py)
    server.run(sockets=[sock])
    core.stop(join_timeout_s=0.0)  # a batch still in the model must not hold the exit past the grace
    return exit_code(core, 1 if failed else 0)
