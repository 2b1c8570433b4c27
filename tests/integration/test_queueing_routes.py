"""The HTTP front end's list of routes is read from the routes (issue 29: one list, not three).

Which paths speak vLLM's API and which queue work was written out twice beside vllm_api.py's routes
(http_errors.VLLM_PATHS, http_middleware.QUEUEING_PATHS). A route vllm_api.py added (as vLLM adds
spellings of /score and /rerank) was then read and decoded under overload instead of being refused
at its headers, and its errors came in rmscore's shape instead of vLLM's. Now both come from
`http_routes.routes(app)`, read from the app itself, and docs/contract.md lists the same paths.

In process, over the servers' own ASGI stack (http_app.served_asgi) and the real ScoringCore of
models/default, built without a backend (tests/fuzz/fuzz_common.py): such a core is warming up, so a
scoring POST is refused 503 "not ready" by RefuseBeforeBody, which must answer without ever calling
`receive` (the body is never read).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

import fuzz_common  # noqa: E402

from rmscore.core.scoring import WARMING_UP  # noqa: E402
from rmscore.frontends import http_app, http_routes, vllm_api  # noqa: E402

EXPECTED_QUEUEING = {"/rmscore/v1/score": False, "/get_reward": True, "/classify": False, "/pooling": False,
                     "/score": True, "/v1/score": True, "/rerank": True, "/v1/rerank": True, "/v2/rerank": True}


def post(asgi, path: str, body: bytes) -> tuple[int, dict, bool]:
    """POST `body` to `path` through `asgi`: (status, JSON answer, whether the app read the body)."""
    read, sent = [], []

    async def receive():
        read.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    asyncio.run(asgi(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(answer), bool(read)


def vllm_shaped(answer: dict) -> bool:
    return set(answer.get("error", {})) == {"message", "type", "param", "code"}


@pytest.fixture
def core():
    c = fuzz_common.core()
    c.state = WARMING_UP
    return c


def test_every_queueing_route_is_refused_before_its_body(core):
    app = http_app.create_app(core)
    found = http_routes.routes(app)
    assert dict(found.queueing) == EXPECTED_QUEUEING
    assert {"/classify", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/tokenize",
            "/v1/models"} <= found.vllm and not found.vllm & {"/rmscore/v1/score", "/get_reward"}
    asgi = http_app.served_asgi(core)
    for path in EXPECTED_QUEUEING:
        status, answer, read = post(asgi, path, b'{"never": "decoded"}')
        assert (status, read) == (503, False), (path, status, answer, read)
        assert vllm_shaped(answer) == (path in found.vllm), (path, answer)


def test_a_route_vllm_api_adds_is_refused_before_its_body_in_vllm_shape(core, monkeypatch):
    # A new spelling of vLLM's score route, registered by vllm_api.register as the others are.
    monkeypatch.setattr(vllm_api, "SCORE_PATHS", (*vllm_api.SCORE_PATHS, "/v3/score"))
    asgi = http_app.served_asgi(core)
    status, answer, read = post(asgi, "/v3/score", b'{"never": "decoded"}')
    assert (status, read) == (503, False), (status, answer, read)
    assert vllm_shaped(answer) and "not ready" in answer["error"]["message"], answer
    # Admitted (no model here: the check before the body lets it through): its body is read, and a
    # malformed one is refused as vLLM refuses it (400, not rmscore's 422).
    monkeypatch.setattr(core, "check_before_body", lambda tokenizes: None)
    status, answer, read = post(asgi, "/v3/score", b'{"text_1": ')
    assert (status, read) == (400, True) and vllm_shaped(answer), (status, answer)


def test_tokenize_queues_no_work_and_is_read(core):
    status, answer, read = post(http_app.served_asgi(core), "/tokenize", b'{"prompt": "hello"}')
    assert read, (status, answer)


def test_the_contract_lists_the_same_paths():
    """docs/contract.md, "Order of checks": the paths refused before the body, and those of them that
    always tokenize, are the routes' own."""
    text = " ".join((ROOT / "docs" / "contract.md").read_text().split())
    listed = re.search(r"scoring request's headers are in \(`POST` to (.*?)\)", text)
    assert listed, "the contract no longer lists the routes refused before the body"
    assert set(re.findall(r"`(/[^`]*)`", listed.group(1))) == set(EXPECTED_QUEUEING)
    tokenizing = re.search(r"on the routes that always tokenize, (.*?) in their spellings", text)
    named = set(re.findall(r"`(/[^`]*)`", tokenizing.group(1)))
    assert named and all(EXPECTED_QUEUEING[p] for p in named)
