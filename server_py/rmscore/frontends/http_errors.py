"""The HTTP side of `ScoreError`: the contract's JSON error body, written in one place for every
HTTP route (/rmscore/v1/score, /get_reward, the body-size and token checks), and vLLM's for the
vLLM-compatible routes (http_routes.routes(app).vllm), which answer as vLLM does. The gRPC side is
`context.abort(code.grpc, message)`; `Code` carries both statuses."""

from __future__ import annotations

import time
from http import HTTPStatus

from fastapi.responses import JSONResponse

from rmscore.core.errors import Code, ScoreError
from rmscore.core.scoring import ScoringCore


def error_response(code: Code, message: str, status: int | None = None) -> JSONResponse:
    """`{"error": {"code", "message"}}` with the code's HTTP status; `status` only where HTTP has a
    more precise one (413 for a body over max_request_bytes, a RESOURCE_EXHAUSTED that is not 429)."""
    return JSONResponse({"error": {"code": code.name, "message": message}}, status_code=status or code.http)


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
