"""The FastAPI app: JSON <-> ScoringCore, ScoreError -> HTTP status; and the served ASGI stack.

`create_app` holds the routes (rmscore's own, the probes, /metrics, and the frameworks' routes);
`served_asgi` is what uvicorn serves: that app inside every middleware (http_middleware.wrap).
The runner (http_server.run) and the fuzz harness (tests/fuzz/fuzz_py_http.py) both take
`served_asgi`, so the stack fuzzed is the stack that serves.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from rmscore.core.errors import Code, ScoreError
from rmscore.core.liveness import now_us
from rmscore.core.scoring import SERVING, ScoringCore
from rmscore.core.validation import INPUT_FACTOR
from rmscore.frontends import http_middleware, json_body, openrlhf, reward_text, vllm_api
from rmscore.frontends.http_errors import error_response, refusal, vllm_error_response
from rmscore.frontends.http_models import ScoreIn, ScoreOut
from rmscore.frontends.http_routes import is_vllm
from rmscore.frontends.model_info import model_info


#: rmscore's own scoring route; /v1/score, its path until 0.1, is vLLM's score route (vllm_api.py).
SCORE_PATH = "/rmscore/v1/score"

# A deadline further away than this is no deadline (1e308 ms overflowed asyncio's timer: a 500).
NO_DEADLINE_MS = 365 * 24 * 3600 * 1e3


def _drop_tracebacks(exc: BaseException) -> None:
    """FastAPI's body reading ends in `raise http_error from e`, a reference cycle (the raising frame
    holds http_error); through its cause's traceback the cycle held the partial body of a client that
    went away or stalled (up to max_request_bytes each) until a full garbage collection, which an idle
    server may not run for minutes: 40 stalled 15 MiB bodies left +12 % resident (docs/hardening.md,
    "Transport attacks (Python)"). The answer is made; the frames are not needed."""
    for _ in range(8):  # the chain is short; bounded all the same
        if exc is None:
            return
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _says_json(content_type: str | None) -> bool:
    """Whether FastAPI decodes a body of this Content-Type as JSON (application/json or */*+json)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _error_handlers(app: FastAPI, core: ScoringCore) -> None:
    """Malformed bodies answered in the contract's shape (422 INVALID_ARGUMENT, the field named), or in
    vLLM's on its routes, and counted: FastAPI's own answers are 422/400 {"detail": ...}."""

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError):
        core.metrics.request(Code.INVALID_ARGUMENT.name, None)
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            reason = (first.get("ctx") or {}).get("error", first["msg"])
            where, message = "body", f"body: malformed JSON at character {first['loc'][-1]}: {reason}"
        elif first["type"] == "too_long" and tuple(first["loc"]) == ("body", "sequences"):
            # Past the HTTP list bound (body_lists.py), the count gets the core's own refusal, as on every kind.
            where = "sequences"
            message = (f"sequences: {first['ctx']['actual_length']} sequences exceed max_sequences_per_request "
                       f"{core.validator.limits.max_sequences_per_request}")
        elif tuple(first["loc"]) == ("body",) and not _says_json(request.headers.get("content-type")):
            # FastAPI reads a body as JSON only when its Content-Type says so (curl -d sends a form's):
            # its "Input should be a valid dictionary" does not say that the header is what is wrong.
            where = "body"
            message = (f"body: not read as JSON: Content-Type is {request.headers.get('content-type', 'missing')!r}; "
                       "send Content-Type: application/json")
        else:
            where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
            message = f"{where}: {first['msg']}"
        if is_vllm(request):  # vLLM's validation handler: 400 "Bad Request", the field as param
            return vllm_error_response(Code.INVALID_ARGUMENT, message, param=where, type_="Bad Request")
        return error_response(Code.INVALID_ARGUMENT, message)

    @app.exception_handler(StarletteHTTPException)
    async def undecodable(request: Request, exc: StarletteHTTPException):
        # FastAPI answers 400 {"detail": ...} to a body json.loads cannot decode at all
        # (not UTF-8, nested too deeply); the contract's answer to malformed JSON is 422.
        if exc.status_code != 400:
            return await http_exception_handler(request, exc)
        _drop_tracebacks(exc)
        cause = exc.__cause__
        if isinstance(cause, (http_middleware.BodyAborted, ClientDisconnect)):
            # Not a malformed body: a middleware refused it, and counts and answers it (413, 408), or the
            # client went mid-body, with nobody left to answer. Counted here, each was INVALID_ARGUMENT
            # as well (a 408 twice), and a client's disconnect a malformed body.
            return error_response(Code.INVALID_ARGUMENT, "body: not read")  # never sent
        core.metrics.request(Code.INVALID_ARGUMENT.name, None)
        reason = ("not UTF-8 text" if isinstance(cause, UnicodeDecodeError) else
                  "nested too deeply" if isinstance(cause, RecursionError) else exc.detail)
        if is_vllm(request):
            return vllm_error_response(Code.INVALID_ARGUMENT, f"body: malformed JSON: {reason}", param="body",
                                       type_="Bad Request")
        return error_response(Code.INVALID_ARGUMENT, f"body: malformed JSON: {reason}")


def create_app(core: ScoringCore, chat_template=None) -> FastAPI:
    """The FastAPI app over `core`; `chat_template`: the --chat-template of the framework routes
    (a reward_text.ChatTemplate)."""
    app = FastAPI(title="rmscore", description="Reward-model scoring (same contract as the gRPC servers)")
    # Large bodies decode off the event loop; the score route's over-long token arrays not at all.
    app.router.route_class = json_body.route_class(
        {SCORE_PATH: INPUT_FACTOR * core.validator.limits.max_sequence_length})

    _error_handlers(app, core)

    @app.post(SCORE_PATH, response_model=ScoreOut)
    async def score(body: ScoreIn):
        t0 = time.perf_counter()
        if body.timeout_ms is not None and body.timeout_ms > NO_DEADLINE_MS:  # as the C++ server reads it
            body.timeout_ms = None
        deadline = None if body.timeout_ms is None else time.monotonic() + body.timeout_ms / 1e3
        try:
            # One call into the core, which checks admission before it validates anything.
            if deadline is None:
                r = await core.score([s.seq_input() for s in body.sequences], body.truncation, None)
            else:
                r = await asyncio.wait_for(
                    core.score([s.seq_input() for s in body.sequences], body.truncation, deadline),
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
    # Conversations (vLLM's messages) render with --chat-template, else the model repository's own
    # template, as vLLM does; without either they are refused with the reason.
    own, missing = reward_text.model_chat_template(core.repo.path)
    encoder = reward_text.Encoder(core.tokenizer_json, core.repo.max_sequence_length, core.cfg.strip_strings,
                                  chat_template, core.max_text_chars, own, missing)
    openrlhf.register(app, core, encoder)
    vllm_api.register(app, core, encoder)


def served_asgi(core: ScoringCore, chat_template=None):
    """The ASGI application uvicorn serves over `core`: the app and every middleware, in serving order.
    `chat_template`: the compiled --chat-template of the framework routes (reward_text.chat_template)."""
    return http_middleware.wrap(create_app(core, chat_template), core.cfg, core)
