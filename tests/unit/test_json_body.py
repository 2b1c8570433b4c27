"""Large JSON bodies decode on a worker thread, one at a time, so a small request arriving with
several large ones is not queued behind all their decoding (frontends/json_body.py; the work
flood of docs/hardening.md, "A queue bounded by work").

Order, not time: a real FastAPI app (httpx's ASGI transport, in process) gets six ~2 MB bodies and
then a small one, all at once; the order in which the endpoint sees them is recorded. Decoded on
the event loop, each body's decoding is one step of its task, run first come first served, so the
small request comes last; behind the gate it comes before most of the large ones.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI

from rmscore.frontends import json_body

BIG = json.dumps({"id": "big", "tokens": [[12345] * 512] * 400}).encode()  # ~2.6 MB


def app_recording(order: list[str], gated: bool) -> FastAPI:
    app = FastAPI()
    if gated:
        app.router.route_class = json_body.route_class()

    @app.post("/score")
    async def score(body: dict):
        order.append(body["id"] if body["id"] == "small" else f"big{len(order)}")
        return {"n": len(body.get("tokens", []))}

    return app


async def send_all(app: FastAPI) -> list[int]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        headers = {"content-type": "application/json"}
        big = [c.post("/score", content=BIG, headers=headers) for _ in range(6)]
        small = c.post("/score", json={"id": "small", "tokens": [[1, 2, 3]]})
        answers = await asyncio.gather(*big, small)
    return [r.status_code for r in answers]


@pytest.mark.parametrize("gated", [False, True], ids=["on the event loop", "on the worker thread"])
def test_a_small_request_is_not_queued_behind_every_large_body(gated):
    assert len(BIG) >= json_body.THREAD_DECODE_MIN_BYTES
    order: list[str] = []
    codes = asyncio.run(send_all(app_recording(order, gated)))
    assert codes == [200] * 7
    position = order.index("small")
    if gated:
        assert position <= 1, order  # at most the one body decoding when it came
    else:
        assert position == 6, order  # the baseline this module exists for: last, behind every body


def test_bad_json_is_refused_as_before_whatever_its_size():
    """A malformed large body reaches FastAPI's own JSON error, as a small one does."""
    async def send(content: bytes) -> httpx.Response:
        app = app_recording([], gated=True)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/score", content=content, headers={"content-type": "application/json"})

    for content in (b'{"id": ', BIG[:-1]):
        r = asyncio.run(send(content))
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == "json_invalid", r.text
