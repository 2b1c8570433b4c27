"""Transport attacks on the Python servers (docs/hardening.md, "Transport attacks (Python)" and "A queue
bounded by work"), small and seconds long:
stalled bodies, a stream flooding the queue, long requests flooding it with work, a PING flood, and a
request with both Content-Length and Transfer-Encoding. The attacks are rmscore_tools.reliability.transport's, as in
`rmscore hardening`. One server per kind for the module; cpp-grpc has its own test module.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

import harness
import servers
from rmscore_tools.observe import metric, rss_mb
from rmscore_tools.reliability import faults, transport

GRPC, HTTP = "py-grpc-onnxruntime", "py-http-onnxruntime"
MiB = 1 << 20
# Small limits, so that two stalled 2 MiB bodies fill the budget and a stall is refused within seconds.
FLAGS = dict(max_request_bytes=4 * MiB, max_buffered_request_bytes=4 * MiB, body_timeout_seconds=2,
             max_stream_items_in_flight=16)


@pytest.fixture(scope="module")
def running():
    wanted = [k for k in (GRPC, HTTP) if k in servers.available_kinds()]
    if not wanted:
        pytest.skip("no Python server kind in RMSCORE_TEST_KINDS")
    started: list = []
    try:
        yield {s.kind: s for s in servers.start_all(wanted, started, **FLAGS)}
    finally:
        for s in started:
            s.stop()


def kind(running, name):
    if name not in running:
        pytest.skip(f"{name} not in RMSCORE_TEST_KINDS")
    return running[name]


def test_ping_flood_gets_goaway_and_streams_are_bounded(running):
    server = kind(running, GRPC)
    # grpcio advertised no SETTINGS_MAX_CONCURRENT_STREAMS (unlimited) before --max-concurrent-streams.
    assert transport.server_settings(server.port).get(3) == 100
    fig = transport.ping_flood(server, pings=20_000)
    assert fig["goaway"] and fig["goaway_code"] == 11, fig  # ENHANCE_YOUR_CALM: too many pings
    # What remains (docs/hardening.md): the pings already read are still answered, ~25-30 us each here.
    assert fig["server_cpu_s"] < 100e-6 * fig["pings_written"], fig


def test_flooding_stream_leaves_room_for_other_callers(running):
    fig = transport.stream_flood(kind(running, GRPC), items=200_000, seconds=6.0)
    assert fig["stream_answers"] > 0 and fig["stream_end"] == "DEADLINE_EXCEEDED", fig
    # Before the per-stream bound: 41 of 43 probes failed, 23 by timing out.
    assert fig["probes"] >= 3 and fig["failed"] == 0, fig


def test_a_queue_bounded_by_work_answers_probes_or_refuses_them_fast(running):
    # Before admission by work (docs/hardening.md, "A queue bounded by work"): 7 of 8 probes timed out
    # behind minutes of queued work.
    # Requests of 32 x 512 tokens (about 2 s each here): admission holds a request's deadline (8 s) to
    # its last sequence, so 128-sequence requests, each past it alone, were all refused and never filled
    # the queue; four callers of these fill it to about that deadline.
    fig = transport.work_flood(kind(running, HTTP), senders=4, seqs=32, seconds=3.0)
    assert fig["flood_codes"].get("DEADLINE_EXCEEDED", 0) + fig["flood_codes"].get("RESOURCE_EXHAUSTED", 0) > 0, fig
    assert fig["max_expected_wait_s"] > 2.0, fig  # the flood did fill the queue past a probe's deadline
    # Every probe was answered inside its 2 s deadline (the server enforces it) or refused well before it:
    # none was admitted and then held until it expired. The goal (refused in < 100 ms) is not met
    # here on py-http: parsing the flood's JSON bodies delays some refusals to 100-250 ms
    # (docs/hardening.md); 1 s is what holds on a busy machine. An admitted probe may take up to its
    # deadline: that is the wait admission expected. CI twice saw a probe expire at 2.03 s: the one sent
    # as the flood began, admitted into an idle server and batched with 15 of the flood's 512-token
    # sequences (4 s of model time here). The planner now cuts such a batch at the deadline (unit tests
    # hold that exactly); probes start once the queue is full (work_flood says why).
    assert fig["probes"] >= 3 and (fig["slowest_refusal_ms"] or 0) < 1000, fig
    assert set(fig["probe_codes"]) <= {"OK", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}, fig


def test_stalled_body_times_out_with_408_and_closes(running):
    server = kind(running, HTTP)
    t0 = time.perf_counter()  # before the headers go: the server's clock starts after this
    s = transport._stall_http(server.port, 1 * MiB, timeout_s=10)
    answer = _read_all(s, 10)
    took = time.perf_counter() - t0
    assert answer.startswith(b"HTTP/1.1 408 ") and b"body_timeout_seconds" in answer, answer[:300]
    assert 1.9 < took < 8.0, took  # body_timeout_seconds is 2; before it: no answer at all


def _closed_within(s: socket.socket, limit_s: float, trickle: bytes = b"") -> float:
    """Seconds until the server closed `s` while `trickle` was sent a byte every 0.25 s (then nothing);
    fails if it is still open after `limit_s`."""
    s.settimeout(0.25)
    t0, i = time.perf_counter(), 0
    while time.perf_counter() - t0 < limit_s:
        if i < len(trickle):
            try:
                s.sendall(trickle[i:i + 1])
            except OSError:  # closed under the write
                return time.perf_counter() - t0
            i += 1
        try:
            if s.recv(1 << 16) == b"":
                return time.perf_counter() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.perf_counter() - t0
    raise AssertionError(f"connection still open after {limit_s} s ({i} bytes sent)")


@pytest.mark.parametrize("trickle", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200],
                         ids=["silent", "a-byte-at-a-time"])
def test_headers_not_received_in_time_close_the_connection(running, trickle):
    # uvicorn arms no timer while headers arrive, and any byte cancels its keep-alive timer: before
    # frontends/http_protocol.py both connections stayed open for as long as the client liked.
    server = kind(running, HTTP)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        took = _closed_within(s, 10.0, trickle)
    assert 1.9 < took < 6.0, took  # body_timeout_seconds is 2
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:  # a prompt request is served
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_all(s, 5).startswith(b"HTTP/1.1 200 ")


def test_bodies_past_the_budget_are_refused_at_once(running):
    server = kind(running, HTTP)
    first = transport._stall_http(server.port, 3 * MiB, timeout_s=10)  # holds 3 of the 4 MiB budget
    try:
        t0 = time.perf_counter()
        second = transport._stall_http(server.port, 2 * MiB, timeout_s=10, send_bytes=0)
        answer = _read_all(second, 10)
        assert answer.startswith(b"HTTP/1.1 413 ") and b"max_buffered_request_bytes" in answer, answer[:300]
        assert time.perf_counter() - t0 < 1.0
    finally:
        first.close()
    time.sleep(0.3)  # the server sees the close and releases the budget: a good request fits again
    assert faults._probe_score(transport.caller.Caller.to(server), transport.PROBE_IDS, 10)[0] == "OK"


@pytest.mark.parametrize("path, length, status", [
    ("/rmscore/v1/score", 5 * MiB, b"413"),  # over max_request_bytes by its Content-Length
    ("/no/such/route", 1000, b"404"),  # Starlette's own answers: they did not close before
    ("/healthz", 1000, b"405"),
])
def test_an_answer_before_100_continue_closes_the_connection(running, path, length, status):
    """`Expect: 100-continue`, answered before the body is asked for: that answer and the connection
    closed. Before, it stayed open waiting for a body that no 100 asked for (the next request became
    that body), and Starlette's 404 and 405 still did so after the 413 was fixed."""
    server = kind(running, HTTP)
    head, closed = harness.expect_continue_refused(server.port, path, length)
    assert head.startswith(b"HTTP/1.1 " + status + b" ") and b"connection: close" in head.lower(), head
    assert closed, f"the connection stayed open after the {status.decode()}"


def test_a_body_asked_for_after_100_continue_keeps_the_connection(running):
    """The other side of the rule: a request whose body the server asks for (the 100 comes) is
    answered 200 without `Connection: close`, and the same connection serves the next request."""
    server = kind(running, HTTP)
    body = json.dumps({"sequences": [{"tokens": harness.GOLDEN_IDS[0]}]}).encode()
    head = (b"POST /rmscore/v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(2):
            sock.sendall(head)
            assert reader.readline().startswith(b"HTTP/1.1 100 ") and reader.readline() == b"\r\n"
            sock.sendall(body)
            lines = iter(reader.readline, b"\r\n")
            answer = b"".join(lines).lower()
            assert answer.startswith(b"http/1.1 200 ") and b"connection: close" not in answer, answer
            length = int(answer.split(b"content-length:")[1].split(b"\r\n")[0])
            assert b'"scores"' in reader.read(length)


@pytest.mark.parametrize("name", [GRPC, HTTP])
def test_stalled_bodies_leave_no_memory_behind(running, name):
    # 128 MiB offered, ~13 % of a Python server's RSS. Before: held after the clients went (40 x 15 MiB:
    # +64 % on py-grpc, glibc kept the freed heap; +12 % on HTTP, a reference cycle kept the bodies).
    fig = transport.stalled_bodies(kind(running, name), connections=32, body_bytes=4 * MiB, hold_s=2, settle_s=4)
    assert fig["rss_after_pct"] < 3 and fig["failed"] == 0, f"{name}: {fig}"


def test_content_length_with_transfer_encoding_is_refused_and_closed(running):
    fig = transport.framing(kind(running, HTTP))
    # RFC 9112 6.3: such a request is an error and the connection must close; the bytes after it
    # must not be served as a second request.
    assert fig == {"cl_te_status": 400, "cl_te_closed": True, "cl_te_second_request_served": False}, fig


def _read_all(s: socket.socket, timeout_s: float) -> bytes:
    """Everything until the server closes the connection (fails if it keeps it open)."""
    s.settimeout(timeout_s)
    out = b""
    while chunk := s.recv(1 << 16):
        out += chunk
    return out


def test_an_over_long_token_array_is_refused_without_being_decoded(running):
    """A `"tokens"` array over 64 x max_sequence_length is refused by its count, its integers never made
    into objects at once (frontends/json_body.py). Decoded whole, the four raised the peak by 33 MiB
    over baseline (+10 undecoded, measured here), and pymalloc kept arenas of such objects after (refused 1M-id bodies: +6% to
    +18% of py-http's resident memory, docs/bench/mmap-threshold_2026-12-07/). Resident memory is sampled
    from outside while four such bodies, each under the module's 4 MiB body limit, are refused in turn."""
    server = kind(running, HTTP)
    n = 500_000
    body = b'{"truncation":"left","sequences":[{"tokens":[' + b",".join(
        b"%d" % (1000 + i % 20000) for i in range(n)) + b"]}]}"
    assert len(body) < 4 * MiB
    pid, peak, done = server.proc.pid, [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.002)

    time.sleep(1)
    base = rss_mb(pid)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for _ in range(4):
            r = httpx.post(server.base_url + "/rmscore/v1/score", content=body, timeout=30,
                           headers={"content-type": "application/json"})
            assert r.status_code == 422, r.text
            assert r.json()["error"]["message"].startswith(f"sequences[0].tokens.ids: length {n} exceeds"), r.text
    finally:
        done.set()
        sampler.join()
    # The body itself (3.4 MB) is held two or three times over: its chunks, the joined bytes, the pieces.
    assert peak[0] - base < 18, f"peak +{peak[0] - base:.1f} MiB over {base:.0f} MiB"


def _chunked_over(port: int, nbytes: int) -> bytes:
    """A chunked POST /rmscore/v1/score of `nbytes` of body: the server's answer (it closes after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /rmscore/v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b" " * (1 << 16)
        try:
            for _ in range(nbytes // len(chunk)):
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except OSError:  # refused and closed under the write
            pass
        return _read_all(s, 10)


def test_each_refused_body_is_counted_once_by_its_own_code(running):
    # rmscore_requests_total counts requests answered, by code. FastAPI turned every read a middleware
    # aborted into a 400, which was counted INVALID_ARGUMENT: a chunked 413 counted as INVALID_ARGUMENT
    # only, a 408 twice, a client gone mid-body as a malformed body; a Content-Length 413 not at all.
    server = kind(running, HTTP)

    def counts():
        return {c: metric(server, "rmscore_requests_total", code=c)
                for c in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")}

    before = counts()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:  # by Content-Length
        s.sendall(b"POST /rmscore/v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (5 * MiB))
        assert _read_all(s, 10).startswith(b"HTTP/1.1 413 ")
    assert _chunked_over(server.port, 5 * MiB).startswith(b"HTTP/1.1 413 ")
    s = transport._stall_http(server.port, 1 * MiB, timeout_s=10)  # 408 after body_timeout_seconds
    assert _read_all(s, 10).startswith(b"HTTP/1.1 408 ")
    s.close()
    s = transport._stall_http(server.port, 1 * MiB, timeout_s=10)  # the client goes mid-body
    s.close()
    time.sleep(0.5)
    after = counts()
    assert {c: after[c] - before[c] for c in after} == \
        {"INVALID_ARGUMENT": 0, "RESOURCE_EXHAUSTED": 2, "DEADLINE_EXCEEDED": 1}, (before, after)
