"""The client's default deadline holds on streams too: a server that stops answering (here: a real
server we SIGSTOP by PID) ends `stream()` with DeadlineExceeded after about the client's `timeout_s`,
as it ends `score()`, instead of hanging the caller's training step. And the deadline is per item,
not per stream: a stream that runs longer than `timeout_s` while its items are answered goes on.
"""

from __future__ import annotations

import pathlib
import signal
import threading
import time

import pytest

import servers
from harness import GOLDEN_IDS
from rmscore_client import NO_RETRY, DeadlineExceeded, HttpRewardClient, RewardClient

KINDS = [k for k in ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime") if k in servers.available_kinds()]
TIMEOUT_S = 3.0
# How long a call may take to give up beyond its deadline: generous, the machine is shared.
SLACK_S = 15.0


@pytest.fixture(scope="module", params=KINDS)
def server(request):
    s = servers.start(request.param)
    yield s
    s.signal(signal.SIGCONT)
    s.stop()


def client_for(server, **kw):
    if server.transport == "http":
        return HttpRewardClient(server.base_url, **kw)
    return RewardClient(server.target, **kw)


def bounded(fn, limit_s: float):
    """fn() on a thread; (result or exception, seconds). Fails the test, rather than hanging it,
    when fn is still running after `limit_s`: the very defect under test."""
    out: dict = {}

    def run():
        t = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test to assert on
            out["value"] = e
        out["s"] = time.monotonic() - t

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"still waiting after {limit_s} s: no deadline"
    return out["value"], out["s"]


def process_state(pid: int) -> str:
    """"T" once every thread of the process is stopped, else the state letters of its threads (from
    /proc/PID/task/*/stat, after the parenthesised name, which may hold spaces)."""
    states = set()
    for stat in pathlib.Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the thread ended meanwhile
            continue
        states.add(text[text.rindex(")") + 2])
    return "T" if states == {"T"} else "".join(sorted(states))


def stopped(server):
    """The server process frozen (SIGSTOP: its sockets stay open, nothing answers) until the block ends."""
    class _Stopped:
        def __enter__(self):
            server.signal(signal.SIGSTOP)
            # kill() returns before every thread has stopped: go on only once the kernel says each
            # has, so an answer cannot come from a thread still running.
            until = time.monotonic() + 10
            while (state := process_state(server.proc.pid)) != "T" and time.monotonic() < until:
                time.sleep(0.01)
            assert state == "T", f"the server did not stop: state {state!r}"

        def __exit__(self, *exc):
            server.signal(signal.SIGCONT)
    return _Stopped()


def test_stream_of_a_silent_server_ends_with_deadline_exceeded(server):
    with client_for(server, timeout_s=TIMEOUT_S, retry=NO_RETRY) as rm:
        assert len(rm.score_ids(GOLDEN_IDS[:2]).scores) == 2  # connected and warm before the stop
        with stopped(server):
            items = [(f"u{i}", ids) for i, ids in enumerate(GOLDEN_IDS[:4])]
            got, took_s = bounded(lambda: list(rm.stream(items)), TIMEOUT_S + SLACK_S)
            state = process_state(server.proc.pid)  # still "T", unless something woke the server
        assert isinstance(got, DeadlineExceeded), (got, f"server threads: {state}")
        assert got.item_id in {uid for uid, _ in items}, got
        assert took_s >= TIMEOUT_S * 0.9, took_s  # the deadline, not some other failure
        # The same client scores again once the server runs: nothing was left broken.
        assert len(rm.score_ids(GOLDEN_IDS[:2]).scores) == 2


def test_score_of_a_silent_server_ends_with_deadline_exceeded(server):
    """The reference behaviour the stream now matches."""
    with client_for(server, timeout_s=TIMEOUT_S, retry=NO_RETRY) as rm:
        assert len(rm.score_ids(GOLDEN_IDS[:2]).scores) == 2
        with stopped(server):
            got, took_s = bounded(lambda: rm.score_ids(GOLDEN_IDS[:4]), TIMEOUT_S + SLACK_S)
        assert isinstance(got, DeadlineExceeded), got


def test_stream_longer_than_the_deadline_goes_on_while_answered(server):
    """Items fed over ~2x the deadline: each is answered in time, so the stream must not end early."""
    n = 8

    def slow_items():
        for i in range(n):
            time.sleep(2 * TIMEOUT_S / n)
            yield i, GOLDEN_IDS[i % len(GOLDEN_IDS)]

    with client_for(server, timeout_s=TIMEOUT_S) as rm:
        got, took_s = bounded(lambda: dict(rm.stream(slow_items())), 2 * TIMEOUT_S + SLACK_S + 30)
    assert isinstance(got, dict) and sorted(got) == list(range(n)), got
    assert took_s > TIMEOUT_S, took_s
