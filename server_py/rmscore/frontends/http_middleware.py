"""The ASGI middlewares around the FastAPI app, and `wrap`, which puts them in serving order.

Each guards the transport before any route runs: framing in doubt, a missing token, a body too
large, an overloaded server (refused before the body is read), a body too slow, a client gone. They are plain ASGI, not Starlette middleware, because each must
see (and may refuse) the request before FastAPI reads its body, and replace the app's answer when
it aborts a read. The order lives in one place, `wrap`, so the runner and the fuzz harness serve
the same stack (`http_app.served_asgi`).
"""

from __future__ import annotations

import asyncio
import time

from fastapi.responses import JSONResponse

from rmscore.core.admission import CALLER
from rmscore.core.config import ServeConfig
from rmscore.core.errors import UNAUTHENTICATED_MESSAGE, Code, ScoreError, bearer_matches
from rmscore.core.scoring import ScoringCore
from rmscore.frontends.http_errors import error_response, refusal
from rmscore.frontends.memory import note_request_bytes
from rmscore.frontends.http_routes import routes


def wrap(app, cfg: ServeConfig, core: ScoringCore):
    """`app` inside every middleware, outermost last. OneFraming is outermost: a request whose length
    is in doubt goes no further. TokenCheck next, so nothing else runs for a refused call. LimitBody
    next: a body over max_request_bytes is refused for that (413: resending it cannot help), whatever
    the load. RefuseBeforeBody then, outside BodyBudget: a request refused for overload reserves no
    bytes of the receiving budget and is never read. CancelOnDisconnect innermost, right around the
    handler it cancels. CloseWhenBodyUnasked around all but OneFraming (which closes anyway), so every
    answer made before a body is asked for closes a connection waiting on `Expect: 100-continue`."""
    asgi = BodyBudget(CancelOnDisconnect(app), cfg.body_timeout_seconds, cfg.max_buffered_request_bytes, core)
    asgi = RefuseBeforeBody(asgi, core, routes(app))
    asgi = LimitBody(asgi, cfg.max_request_bytes, core)
    if cfg.auth_token:
        asgi = TokenCheck(asgi, cfg.auth_token, core)
    return OneFraming(CloseWhenBodyUnasked(asgi))


class CloseWhenBodyUnasked:
    """ASGI middleware: an answer to a request that sent `Expect: 100-continue`, begun before anything
    asked for its body, carries `Connection: close`. That client waits to send its body, which no 100
    will ask for now (uvicorn sends the 100 at the first read), so the server would wait for it until
    the body deadline and take the next request as that body. Closing says so (RFC 9110 10.1.1), and
    there is no body to reset. One rule for every such answer: the refusals made at the headers (401,
    the announced size's 413, the overload 429 and 503) and Starlette's own 404 and 405."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not any(k == b"expect" for k, _ in scope.get("headers") or ()):
            return await self.app(scope, receive, send)
        asked = False

        async def receive_asked():
            nonlocal asked
            asked = True
            return await receive()

        async def send_closing(message):
            if message["type"] == "http.response.start" and not asked:
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        return await self.app(scope, receive_asked, send_closing)


class RefuseBeforeBody:
    """ASGI middleware: a POST to a route that queues work (`http_routes.routes(app).queueing`, read from
    the app's routes) is refused with that route's
    answer (429 queue full, 503 not ready, in vLLM's shape on its routes) as soon as its headers are in,
    when the server is already over what any request would be refused for (ScoringCore.check_before_body:
    not ready, the work or the tokenizing ahead over max_queue_wait_seconds). Its body is never read
    or decoded: decoding and validating 2.6 MB bodies before the work check made refusals under a flood
    take 100-435 ms (issue 29, defect 5). The connection stays open: uvicorn's h11 protocol drops the
    rest of a body whose answer is complete and then serves the next request on it, and the rest must
    arrive within body_timeout_seconds (http_protocol.py) or the connection is closed. Closing at once
    would reset the connection under a client still sending, which may then lose the answer."""

    def __init__(self, app, core: ScoringCore, routes):
        self.app, self.core, self.routes = app, core, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            tokenizes = self.routes.queueing.get(scope["path"])
            if tokenizes is not None:
                t0 = time.perf_counter()
                try:
                    self.core.check_before_body(tokenizes)
                except ScoreError as e:
                    resp = refusal(self.core, e, t0, vllm=scope["path"] in self.routes.vllm)
                    return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class BodyAborted(Exception):
    """A middleware stopped the app's body read and answers the request itself (413, 408), counted
    there: FastAPI turns the aborted read into a 400 that http_app must neither answer nor count."""


class _BodyTooLarge(BodyAborted):
    pass


class LimitBody:
    """ASGI middleware: refuse bodies over max_request_bytes with 413 before parsing them, by
    Content-Length, or, for a chunked body, by the bytes read so far (it was read and parsed whole)."""

    def __init__(self, app, limit: int, core: ScoringCore):
        self.app, self.limit, self.core = app, limit, core

    def _refuse(self, what: str) -> JSONResponse:
        self.core.metrics.request(Code.RESOURCE_EXHAUSTED.name, None)
        return error_response(Code.RESOURCE_EXHAUSTED, f"body of {what} bytes exceeds max_request_bytes {self.limit}",
                              status=413)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and int(length) > self.limit:
            return await self._refuse(str(int(length)))(scope, receive, send)
        if length is not None:
            note_request_bytes(int(length))
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


class OneFraming:
    """ASGI middleware: a request with both Content-Length and Transfer-Encoding is answered 400 and
    its connection closed (RFC 9112 6.3: a server may not trust either length then, and what follows
    on the connection may be a smuggled request). h11 accepts a well-chunked such body and served the
    bytes after it as a second request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            # Who the request comes from, for the shares (core/admission.py): its connection. uvicorn runs
            # each request in a task of its own, so this holds for this request and what it starts.
            client = scope.get("client")
            CALLER.set(f"{client[0]}:{client[1]}" if client else "")
            names = {k for k, _ in scope.get("headers") or ()}
            if b"content-length" in names and b"transfer-encoding" in names:
                resp = error_response(Code.INVALID_ARGUMENT, "request has both Content-Length and "
                                      "Transfer-Encoding (RFC 9112 6.3): the connection is closed", status=400)
                resp.headers["Connection"] = "close"
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class _BodyRefused(BodyAborted):
    pass


class BodyBudget:
    """ASGI middleware: a body must arrive whole within `timeout_s` (else 408), and the bodies being
    received, summed over every connection, stay within `limit` bytes (else 413 RESOURCE_EXHAUSTED):
    40 clients each sending most of a 16 MiB body and then stalling held 650 MiB (stalled bodies,
    docs/hardening.md). A body's Content-Length is reserved before it is read; a chunked one is
    counted as it comes; both are released once the body is complete. The refused connection is
    closed: its body was not read."""

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


class CancelOnDisconnect:
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


class TokenCheck:
    """ASGI middleware: `Authorization: Bearer <token>` on every path but the probes' (/healthz,
    /readyz, /livez, vLLM's /health) and /metrics (unauthenticated on every server kind: the gRPC
    servers serve it on their own metrics port). Outside every body middleware, so nothing else runs
    for a refused call."""

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
