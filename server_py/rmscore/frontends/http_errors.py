"""The HTTP side of `ScoreError`: the contract's JSON error body, written in one place for every
HTTP route (/rmscore/v1/score, /get_reward, the body-size and token checks). The gRPC side is
`context.abort(code.grpc, message)`; `Code` carries both statuses."""

from __future__ import annotations

import time

from fastapi.responses import JSONResponse

from rmscore.core.errors import Code, ScoreError
from rmscore.core.scoring import ScoringCore


def error_response(code: Code, message: str, status: int | None = None) -> JSONResponse:
    """`{"error": {"code", "message"}}` with the code's HTTP status; `status` only where HTTP has a
    more precise one (413 for a body over max_request_bytes, a RESOURCE_EXHAUSTED that is not 429)."""
    return JSONResponse({"error": {"code": code.name, "message": message}}, status_code=status or code.http)


def refusal(core: ScoringCore, e: ScoreError, t0: float) -> JSONResponse:
    """A request that failed with `e` after starting at `t0` (perf_counter): counted, then answered."""
    core.metrics.request(e.code.name, time.perf_counter() - t0)
    return error_response(e.code, e.message)
