"""The HTTP server's transport: a response is not held back by Nagle's algorithm.

With Nagle on, uvicorn's two writes per response (headers, then body) wait for the client's
delayed ACK of the first: about 40 ms on every request on Linux loopback, whatever the work. The
signature is unmistakable, so the check counts stalled requests rather than timing the server:
with TCP_NODELAY a health round trip on loopback takes a few milliseconds even on a busy machine.
"""

from __future__ import annotations

import time

import httpx
import pytest

import servers

KIND = "py-http-onnxruntime"
STALL_MS = 35.0  # the delayed-ACK timer is 40 ms; a stalled response cannot come back sooner


@pytest.mark.skipif(KIND not in servers.available_kinds(), reason=f"{KIND} not among RMSCORE_TEST_KINDS")
def test_responses_are_not_delayed_by_nagle():
    server = servers.start(KIND)
    try:
        with httpx.Client(base_url=f"http://{server.target}", timeout=10) as client:
            client.get("/readyz")  # the connection is open and kept alive from here on
            stalled = []
            for _ in range(30):
                t0 = time.perf_counter()
                assert client.get("/readyz").status_code == 200
                ms = (time.perf_counter() - t0) * 1e3
                if ms >= STALL_MS:
                    stalled.append(round(ms, 1))
        assert len(stalled) < 10, f"{len(stalled)}/30 responses took >= {STALL_MS} ms: {stalled}"
    finally:
        server.stop()
