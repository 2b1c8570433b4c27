"""--max-connection-age-seconds makes a round_robin client find replicas added after it connected.

A gRPC channel resolves its name when it starts and again only when a connection closes, so
without a connection age a trainer balancing over a Kubernetes headless Service keeps its first
pods forever and the ones the autoscaler adds stay idle (docs/deploy.md). Here, for real: a small
DNS server on loopback answers the client's `dns://127.0.0.1:PORT/NAME:port` target (gRPC's c-ares
resolver asks that server, not the system's), first with server A's address only, then with A's
and B's; B must get traffic within a few connection ages. B listens on 127.0.0.2 with A's port,
since an A record carries an address and no port.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import types

import httpx
import pytest

import servers
from harness import GOLDEN_IDS
from rmscore_tools import launch
from rmscore_client import AsyncRewardClient
from rmscore_tools.observe import metric

# The connection age is the gRPC frontend's.
KINDS = [k for k in servers.frontend_kinds() if launch.transport(k) == "grpc"]
NAME = "replicas.rmscore.test"
AGE_S = 2.0


class TinyDns:
    """Answers A queries for NAME with `self.addresses` (TTL 0), anything else with no answer.
    UDP only: the answers are far below 512 bytes, so the resolver never falls back to TCP."""

    def __init__(self, addresses: list[str]):
        self.addresses = addresses
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.a_queries = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:  # closed
                return
            self.sock.sendto(self._answer(query), peer)

    def _answer(self, query: bytes) -> bytes:
        qid, flags = struct.unpack("!HH", query[:4])
        end, labels = 12, []
        while query[end]:
            labels.append(query[end + 1:end + 1 + query[end]].decode())
            end += 1 + query[end]
        qtype = struct.unpack("!H", query[end + 1:end + 3])[0]
        question = query[12:end + 5]
        records = []
        if qtype == 1 and ".".join(labels).lower() == NAME:
            self.a_queries += 1
            # Name: a pointer to the question's (offset 12); type A, class IN, TTL 0, 4 bytes.
            records = [struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(a) for a in self.addresses]
        header = struct.pack("!HHHHHH", qid, 0x8180 | (flags & 0x0100), 1, len(records), 0, 0)
        return header + question + b"".join(records)

    def close(self) -> None:
        self.sock.close()


def ok_requests(metrics_port: int, host: str) -> float:
    """Requests answered OK, summed over the label sets, from the /metrics of the replica at `host`."""
    scrape = types.SimpleNamespace(metrics_text=lambda: httpx.get(f"http://{host}:{metrics_port}/metrics",
                                                                  timeout=10).text)
    return metric(scrape, "rmscore_requests_total", code="OK")


@pytest.mark.parametrize("kind", KINDS)
def test_round_robin_client_reaches_a_replica_added_later(kind):
    a = servers.start(kind, max_connection_age_seconds=AGE_S, max_connection_age_grace_seconds=1)
    b = servers.start(kind, port=a.port, host="127.0.0.2", wait_ready=False,
                      max_connection_age_seconds=AGE_S, max_connection_age_grace_seconds=1)
    dns = TinyDns(["127.0.0.1"])
    try:
        deadline = time.monotonic() + 400
        while not launch.is_ready(kind, b.port, host="127.0.0.2"):
            assert b.proc.poll() is None and time.monotonic() < deadline, b.log()[-3000:]
            time.sleep(0.2)
        reached_b_after = asyncio.run(_drive(dns, a, b))
        # B is reached at the first re-resolution after A's connection reached its age (+-10% jitter, + the grace).
        assert reached_b_after < 3 * AGE_S + 2, \
            f"B got no request within {reached_b_after:.1f} s of being resolvable (DNS A queries: {dns.a_queries})"
    finally:
        dns.close()
        for s in (a, b):
            s.stop()


async def _drive(dns: TinyDns, a, b) -> float:
    """Score on the DNS name while only A resolves (all of it must land on A), then add B: the
    seconds until B's counter moves (or 6 ages, when it did not)."""
    target = f"dns://127.0.0.1:{dns.port}/{NAME}:{a.port}"
    # gRPC waits 30 s between resolutions by default; the cool-down is not what is under test.
    async with AsyncRewardClient(target, channel_options=[("grpc.dns_min_time_between_resolutions_ms", 200)]) as rm:
        a0 = ok_requests(a.metrics_port, "127.0.0.1")
        for _ in range(10):
            await rm.score_ids(GOLDEN_IDS[:1])
        sent = ok_requests(a.metrics_port, "127.0.0.1") - a0
        assert sent == 10, f"while only A resolved, A answered {sent} of 10"
        dns.addresses = ["127.0.0.1", "127.0.0.2"]
        b0, t0 = ok_requests(b.metrics_port, "127.0.0.2"), time.monotonic()
        while time.monotonic() - t0 < 6 * AGE_S:
            await rm.score_ids(GOLDEN_IDS[:1])
            if ok_requests(b.metrics_port, "127.0.0.2") > b0:
                return time.monotonic() - t0
            await asyncio.sleep(0.05)
    return time.monotonic() - t0
