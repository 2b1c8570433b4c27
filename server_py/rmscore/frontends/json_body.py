"""Large JSON bodies are decoded on a worker thread, one at a time, not on the event loop.

`json.loads` holds the GIL for the whole body: about 14 ms for a 128 x 512-token request (430 KB)
here. FastAPI decodes a body on the event loop, so when eight clients sent such bodies back to back
a one-sequence request queued behind their decoding and its answer (a refusal that was itself immediate) took
100-250 ms (the work flood: docs/hardening.md, "A queue bounded by work"). On one worker thread a big body
still holds the GIL while it decodes, but only one at a time, and the event loop runs between them, so a small
request waits for at most one decoding, not for all of them.

The hook is FastAPI's own (a custom `APIRoute` whose `Request.json()` is replaced): FastAPI still
decides when a body is JSON and maps a decoding error (`json.JSONDecodeError`, `RecursionError`,
`UnicodeDecodeError` are raised from the thread unchanged) exactly as before.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Coroutine

from fastapi import Request, Response
from fastapi.routing import APIRoute

#: Bodies up to this many bytes decode on the event loop (well under a millisecond); larger ones on
#: the worker thread, whose hand-off costs about 0.1 ms.
THREAD_DECODE_MIN_BYTES = 64 << 10


class _ThreadDecodedRequest(Request):
    """A request whose `json()` decodes a large body on a worker thread, behind `gate`."""

    gate: asyncio.Semaphore

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) < THREAD_DECODE_MIN_BYTES:
                self._json = json.loads(body)
            else:
                async with self.gate:  # one at a time: each holds the GIL while it decodes
                    self._json = await asyncio.to_thread(json.loads, body)
        return self._json


def route_class() -> type[APIRoute]:
    """An `APIRoute` for one app (`app.router.route_class = route_class()` before adding routes):
    its routes decode large JSON bodies on a worker thread, one at a time in the whole app."""
    gate = asyncio.Semaphore(1)  # bound to the server's loop on first use (Python >= 3.10)

    class GatedRequest(_ThreadDecodedRequest):
        pass

    GatedRequest.gate = gate

    class ThreadDecodedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                return await handler(GatedRequest(request.scope, request.receive))
            return handle

    return ThreadDecodedRoute
