"""HTTP refuses overload before reading a body (issue 29, defect 5; docs/contract.md, "Order of checks").

Before: a 2.6 MB body was decoded and validated before the work check (about 0.8 s each), so 37 of 71
probes were refused in 100-435 ms. Now, once the queue is over --max-queue-wait-seconds, a scoring
request is refused with its route's 429 as soon as its headers are in: its body is never decoded, the
rest of it is read and dropped by the server, and the connection stays usable.

The queue is held over its bound for real: RMSCORE_FAULT_HANG_BATCH stalls the first batch, as a slow
model would. Callers are admitted by their own share (docs/contract.md, "Shares per caller"): a new
connection waits only for the batches running, so the stalled batch itself holds all 64 x 512 tokens
(one batch of the whole request: length_aware, up to 64 sequences, no batch time bound), which is over
the bound for every caller. Each refused request sends a ~3 MB body on its own connection; the time measured is from its
last byte sent to the answer's first byte.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import servers
from rmscore_tools.reliability.transport import expected_wait_s

HTTP = "py-http-onnxruntime"
HANG_S = 12
SENDERS = 6  # at once, as a flood's requests come: before, each waited for the others' decoding
MAX_WAIT_S = 1
FAST_MS = 100.0
BODY_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def server():
    if HTTP not in servers.available_kinds():
        pytest.skip(f"{HTTP} not in RMSCORE_TEST_KINDS")
    s = servers.start(HTTP, max_queue_wait_seconds=MAX_WAIT_S, body_timeout_seconds=BODY_TIMEOUT_S,
                      batching="length_aware", max_batch_size=64, max_batch_tokens=64 * 512, max_batch_ms=0,
                      # The stop after the test does not wait out the stalled batch (22 s of teardown).
                      drain_grace_seconds=2, env={"RMSCORE_FAULT_HANG_BATCH": f"1:{HANG_S}"})
    yield s
    s.stop()


def _big_ids_body(n: int = 128, length: int = 4096) -> bytes:
    seqs = [{"tokens": [1000 + (i * 7 + k) % 20000 for k in range(length)]} for i in range(n)]
    return json.dumps({"sequences": seqs, "truncation": "right"}).encode()


def _send(port: int, path: str, body: bytes, then_health: bool = True) -> tuple[int, bytes, float, bool]:
    """POST `body` on a fresh connection: (status, answer body, ms from the last byte sent to the first
    byte of the answer, whether a GET /healthz on the same connection was then served)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), len(body)) + body)
        t0 = time.perf_counter()
        first = s.recv(1 << 16)
        took_ms = (time.perf_counter() - t0) * 1e3
        head, _, rest = first.partition(b"\r\n\r\n")
        while b"\r\n\r\n" not in first:  # headers in more than one segment
            first += s.recv(1 << 16)
            head, _, rest = first.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += s.recv(1 << 16)
        status = int(head.split(b" ", 2)[1])
        served = False
        if then_health and b"connection: close" not in head.lower():
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            served = s.recv(1 << 16).startswith(b"HTTP/1.1 200 ")
        return status, rest[:length], took_ms, served
    finally:
        s.close()


def test_overload_is_refused_before_the_body_is_read(server):
    hold = threading.Thread(target=lambda: httpx.post(
        server.base_url + "/rmscore/v1/score", timeout=HANG_S + 30,
        json={"sequences": [{"tokens": [1000 + k for k in range(512)]} for _ in range(64)]}), daemon=True)
    hold.start()
    end = time.monotonic() + 15
    while expected_wait_s(server) <= MAX_WAIT_S and time.monotonic() < end:
        time.sleep(0.05)
    assert expected_wait_s(server) > MAX_WAIT_S, "the queue never went over its work bound"

    body = _big_ids_body()
    assert len(body) > 2_500_000
    with ThreadPoolExecutor(SENDERS) as pool:
        outcomes = list(pool.map(lambda _: _send(server.port, "/rmscore/v1/score", body), range(2 * SENDERS)))
    for status, answer, _, served in outcomes:
        error = json.loads(answer)["error"]
        assert status == 429 and error["code"] == "RESOURCE_EXHAUSTED" and "queue full" in error["message"], answer
        assert served, "the connection was not usable after the refusal"
    ms = sorted(o[2] for o in outcomes)
    print("refused in ms:", [round(x) for x in ms])
    # Before: each body was decoded and validated before the work check refused it, one decoding at a
    # time (json_body.py), so most refusals took 100-700 ms here.
    assert statistics.median(ms) < FAST_MS, ms

    # The framework routes refuse the same way, each with its own error shape.
    text = "word " * 500_000
    for path, payload, vllm in (("/get_reward", {"query": [text[:100_000]] * 25}, False),
                                ("/classify", {"input": [[1000 + k for k in range(4096)]] * 128}, True),
                                ("/score", {"text_1": "q", "text_2": [text[:100_000]] * 25}, True)):
        status, answer, took_ms, served = _send(server.port, path, json.dumps(payload).encode())
        error = json.loads(answer)["error"]
        assert status == 429 and served, (path, status, answer)
        if vllm:
            assert error["code"] == 429 and error["type"] == "Too Many Requests" and "queue full" in error["message"]
        else:
            assert error["code"] == "RESOURCE_EXHAUSTED" and "queue full" in error["message"], answer
        assert took_ms < 10 * FAST_MS, (path, took_ms)  # one each: a loose bound against CI noise

    # The rest of a refused body is due within body_timeout_seconds of the answer, as the next
    # headers are: a client that stalls after its refusal is closed, not held open.
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        s.sendall(b"POST /rmscore/v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body[:1 << 20])
        t0, answer = time.perf_counter(), b""
        while chunk := s.recv(1 << 16):
            answer += chunk
        took = time.perf_counter() - t0
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
    assert BODY_TIMEOUT_S - 0.2 < took < BODY_TIMEOUT_S + 4, took
