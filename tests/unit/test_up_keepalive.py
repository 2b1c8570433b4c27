"""The measuring clients never reuse an HTTP connection at the edge of the server's keep-alive.

`rmscore up`'s contended phase once failed one HTTP call with ReadError(''): uvicorn closes a
connection idle for 5 s and httpx reused idle connections for 5 s, so a request could leave on a
connection the server was closing at that very moment. The race is a matter of microseconds
against a real server; this stub server makes it certain instead: it resets (RST, as a kernel
does for a socket closed with unread data) any request that arrives on a connection idle for
longer than its limit, here just above the clients' KEEPALIVE_EXPIRY_S. A client that expires
idle connections first opens a new one and is answered; httpx's default pool (5 s) reuses the
old one and fails (ReadError or RemoteProtocolError, as the reset or the close lands first),
which shows the stub reproduces the failure the fix is for.
"""

from __future__ import annotations

import asyncio
import json
import socket
import socketserver
import struct
import threading
import time

import httpx
import pytest

from rmscore_tools import caller
from rmscore_client.http_client import KEEPALIVE_EXPIRY_S

SERVER_IDLE_LIMIT_S = KEEPALIVE_EXPIRY_S + 0.3
IDLE_S = KEEPALIVE_EXPIRY_S + 0.6  # between the two limits: past ours, short of httpx's 5 s


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.server.connections += 1
        last = time.monotonic()
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = self.rfile.read(1)
                if not byte:
                    return
                head += byte
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), b"0"))
            body = self.rfile.read(length)
            if time.monotonic() - last > SERVER_IDLE_LIMIT_S:
                # The keep-alive timer fired as the request came in: reset, no response byte.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            n = len(json.loads(body)["sequences"]) if body else 0
            out = json.dumps({"scores": [0.5] * n, "model_version": "stub", "timings": {}}).encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(out), out))
            last = time.monotonic()


@pytest.fixture
def stub():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.connections = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_idle_connections_expire_before_the_servers_keep_alive(stub):
    url = f"http://127.0.0.1:{stub.server_address[1]}"
    body = {"sequences": [{"tokens": [1, 2, 3]}]}

    async def run() -> dict:
        measuring = caller.async_client("http", url, chunk_size=1, timeout_s=10)
        default = httpx.AsyncClient(base_url=url)  # httpx's own pool: idle connections kept 5 s
        blocking = caller.Caller("http", url, timeout_s=10)
        try:
            await measuring.score_ids([[1, 2, 3]])
            await default.post("/rmscore/v1/score", json=body)
            blocking.score_ids([[1, 2, 3]])
            await asyncio.sleep(IDLE_S)
            out = {"measuring": (await measuring.score_ids([[4, 5]])).scores,
                   "blocking": blocking.score_ids([[4, 5]]).scores}
            with pytest.raises(httpx.TransportError):
                await default.post("/rmscore/v1/score", json=body)
            return out
        finally:
            await measuring.close()
            await default.aclose()
            blocking.close()

    assert asyncio.run(run()) == {"measuring": [0.5], "blocking": [0.5]}
    # 3 first connections, then 2 fresh ones for the expiring clients and 1 reused by httpx's default.
    assert stub.connections == 5
