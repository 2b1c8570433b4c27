"""The one list of the HTTP front end's routes: which paths speak vLLM's API and which queue work, read
from the app's own routes (`routes(app)`). The error handlers (http_app.py) and
http_middleware.RefuseBeforeBody both use it, so a route vllm_api.py adds (a new spelling of /score,
say) is answered in vLLM's shape and refused before its body without a second list to keep in step.
Before, the paths were written out twice beside the routes (http_errors.VLLM_PATHS,
http_middleware.QUEUEING_PATHS), and a route missing from either was read and decoded under
overload, or answered in rmscore's shape (tests/integration/test_queueing_routes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from fastapi.routing import APIRoute

from rmscore.frontends import openrlhf, vllm_api, vllm_protocol


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
    any other body, a new one included, may carry ids."""
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
