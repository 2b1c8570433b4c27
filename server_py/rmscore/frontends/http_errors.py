"""The HTTP side of `ScoreError`: the contract's JSON error body, written in one place for every
HTTP route (/rmscore/v1/score, /get_reward, the body-size and token checks), and vLLM's for the
vLLM-compatible routes (`routes(app).vllm`), which answer as vLLM does. The gRPC side is
`context.abort(code.grpc, message)`; `Code` carries both statuses.

`routes(app)` is the one list of which paths speak vLLM's API and which queue work, read from the
app's own routes: the error handlers and http_middleware.RefuseBeforeBody both use it, so a route
vllm_api.py adds (a new spelling of /score, say) is answered in vLLM's shape and refused before its
body without a second list to keep in step. Before, the paths were written out twice beside the
routes, and a route missing from either was read and decoded under overload, or answered in the
wrong shape."""

from __future__ import annotations

import time
from dataclasses import dataclass
from http import HTTPStatus
from types import MappingProxyType
from typing import Mapping

from fastapi.responses import JSONResponse

from rmscore.core.errors import Code, ScoreError
from rmscore.core.scoring import ScoringCore


def error_response(code: Code, message: str, status: int | None = None) -> JSONResponse:
    """`{"error": {"code", "message"}}` with the code's HTTP status; `status` only where HTTP has a
    more precise one (413 for a body over max_request_bytes, a RESOURCE_EXHAUSTED that is not 429)."""
    return JSONResponse({"error": {"code": code.name, "message": message}}, status_code=status or code.http)


@dataclass(frozen=True)
class Routes:
    """What the front end must know of its routes, read from them (`routes`)."""

    vllm: frozenset[str]  # the paths of vllm_api.py's routes: their errors have vLLM's shape and statuses
    # The POST paths that queue model work, each with whether it always tokenizes text: refused before
    # the body when the server is over its bounds (http_middleware.RefuseBeforeBody).
    queueing: Mapping[str, bool]


def _read_routes(app) -> Routes:
    """Every route of `app` by its endpoint and body model. A POST route queues work unless its body is
    vLLM's TokenizeIn (/tokenize tokenizes on the bounded pool and queues no model work); it always
    tokenizes when its body carries text only (OpenRLHF's GetRewardIn, vLLM's ScoreIn and RerankIn);
    any other body, a new one included, may carry ids. Imported here: vllm_api imports this module."""
    from fastapi.routing import APIRoute

    from rmscore.frontends import openrlhf, vllm_api, vllm_protocol

    text_only = (openrlhf.GetRewardIn, vllm_protocol.ScoreIn, vllm_protocol.RerankIn)
    vllm, queueing = set(), {}
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        if route.endpoint.__module__ == vllm_api.__name__:
            vllm.add(route.path)
        if "POST" in route.methods:
            bodies = [p.field_info.annotation for p in route.dependant.body_params]
            if vllm_protocol.TokenizeIn in bodies:
                continue
            queueing[route.path] = any(isinstance(b, type) and issubclass(b, text_only) for b in bodies)
    return Routes(frozenset(vllm), MappingProxyType(queueing))


def routes(app) -> Routes:
    """`app`'s Routes, read once all its routes are registered (the first request, or
    http_middleware.wrap) and kept on app.state."""
    found = getattr(app.state, "rmscore_routes", None)
    if found is None:
        found = app.state.rmscore_routes = _read_routes(app)
    return found


def is_vllm(request) -> bool:
    """Whether `request` (a Starlette Request) came to one of vLLM's routes."""
    return request.url.path in routes(request.app).vllm
# vLLM's ErrorResponse.type for the statuses its handlers name (serve/exception_handling): a request
# it cannot serve is a ValueError there, 400 BadRequestError; others take the HTTP phrase.
_VLLM_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def vllm_error_response(code: Code, message: str, param: str | None = None, type_: str | None = None) -> JSONResponse:
    """vLLM's ErrorResponse, `{"error": {"message", "type", "param", "code"}}` with `code` the HTTP
    status: 400 where rmscore's contract says 422 (vLLM refuses a bad request with 400), else the
    contract's status for the same condition (429 queue full, 503 not ready, ...)."""
    status = 400 if code == Code.INVALID_ARGUMENT else code.http
    kind = type_ or _VLLM_TYPES.get(status) or HTTPStatus(status).phrase
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


def refusal(core: ScoringCore, e: ScoreError, t0: float, vllm: bool = False) -> JSONResponse:
    """A request that failed with `e` after starting at `t0` (perf_counter): counted, then answered
    (in vLLM's shape for the vLLM routes)."""
    core.metrics.request(e.code.name, time.perf_counter() - t0)
    return vllm_error_response(e.code, e.message) if vllm else error_response(e.code, e.message)
