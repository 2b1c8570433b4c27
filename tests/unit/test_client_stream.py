"""rmscore_client's gRPC `stream(...)` (streaming.GrpcStream) against a fake ScoreStream, no server.

The client is a real AsyncRewardClient whose `_rpc()` (the stub it opens calls on) returns
`Replica` below: each ScoreStream call it opens is a `Call` that records what the client writes
and answers as the test's `on_request` says. Everything runs on a loop whose clock the test
drives (virtual_time): backoffs and deadlines of seconds take no real time and land on exact
instants. Item k carries the tokens [k] and the caller id ("row", k); its score is k + 0.5.
"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from rmscore_client import AsyncRewardClient, RetryPolicy
from rmscore_client.errors import DeadlineExceeded, InvalidInput, Overloaded, RewardServerError, Unavailable
from rmscore_client.v1 import reward_pb2 as pb

import virtual_time

# google.rpc.Code numbers, as ScoreStreamResponse.error.code carries them
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE = 3, 8, 14
_END = object()


def item(k: int):
    return ("row", k), [k]


def score_of(k: int) -> float:
    return k + 0.5


def k_of(req) -> int:
    return req.sequence.tokens.ids[0]


class Call:
    """One ScoreStream call as the client sees it (grpc.aio's StreamStreamCall: write, done_writing,
    async iteration, cancel), answered by the test."""

    def __init__(self, replica: Replica, timeout: float | None):
        self.replica, self.timeout = replica, timeout
        self.opened_at = virtual_time.now()
        self.requests: list[tuple[float, pb.ScoreStreamRequest]] = []  # (when written, what)
        self.half_closed = self.cancelled = self.ended = False
        self._out: asyncio.Queue = asyncio.Queue()
        if timeout is not None:  # as gRPC does: the call ends with DEADLINE_EXCEEDED when its timeout passes
            asyncio.get_running_loop().call_later(timeout, self.fail, grpc.StatusCode.DEADLINE_EXCEEDED,
                                                  "Deadline Exceeded")

    # ---- the client's side -------------------------------------------------------------------
    async def write(self, req):
        if self.cancelled or self.ended:
            raise asyncio.InvalidStateError("the call is over")
        self.requests.append((virtual_time.now(), req))
        self.replica.on_request(self, req)

    async def done_writing(self):
        self.half_closed = True
        self.replica.on_half_close(self)

    def cancel(self):
        self.cancelled = True
        self._out.put_nowait(_END)

    def __aiter__(self):
        return self._read()

    async def _read(self):
        while True:
            r = await self._out.get()
            if r is _END:
                return
            if isinstance(r, BaseException):
                raise r
            yield r

    # ---- the replica's side ------------------------------------------------------------------
    def score(self, req, value: float | None = None):
        if not self.ended:
            value = score_of(k_of(req)) if value is None else value
            self._out.put_nowait(pb.ScoreStreamResponse(id=req.id, score=value))

    def refuse(self, req, code: int, message: str = "refused"):
        if not self.ended:
            self._out.put_nowait(pb.ScoreStreamResponse(id=req.id, error=pb.Error(code=code, message=message)))

    def later(self, delay_s: float, fn, *args):
        asyncio.get_running_loop().call_later(delay_s, fn, *args)

    def end(self):
        """The server closes the call with OK."""
        if not self.ended:
            self.ended = True
            self._out.put_nowait(_END)

    def fail(self, code: grpc.StatusCode, details: str):
        """The call breaks (replica gone, deadline passed)."""
        if not self.ended and not self.cancelled:
            self.ended = True
            self._out.put_nowait(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details))

    @property
    def ks(self) -> list[int]:
        return [k_of(r) for _, r in self.requests]


class Replica:
    """The stub behind every call the client opens (`client._rpc()`): scores each item at once unless
    `on_request(call, req)` says otherwise, and ends a call once the client half-closes it."""

    def __init__(self, on_request=None, on_open=None):
        self.calls: list[Call] = []
        self._on_request, self._on_open = on_request, on_open

    def ScoreStream(self, timeout=None, metadata=None):  # noqa: N802 - the stub's method name
        call = Call(self, timeout)
        self.calls.append(call)
        if self._on_open is not None:
            self._on_open(call)
        return call

    def on_request(self, call, req):
        if self._on_request is None:
            call.score(req)
        else:
            self._on_request(call, req)

    def on_half_close(self, call):
        call.end()


def client(replica: Replica, **kw) -> AsyncRewardClient:
    kw.setdefault("timeout_s", None)
    c = AsyncRewardClient("fake:1", **kw)
    c._rpc = lambda: replica
    return c


def stream(c, items, **kw):
    """Run `c.stream(items)` to its end: (what it yielded with the instant of each, what it raised, when it ended)."""
    async def go():
        got, exc = [], None
        try:
            async for uid, res in c.stream(items, **kw):
                got.append((uid, res, virtual_time.now()))
        except Exception as e:  # noqa: BLE001 - handed to the test
            exc = e
        return got, exc, virtual_time.now()

    return virtual_time.run(go())


def assert_each_scored_once(got, n):
    assert sorted(uid for uid, _, _ in got) == [item(k)[0] for k in range(n)], got
    assert all(res == score_of(uid[1]) for uid, res, _ in got), got


@pytest.fixture
def top_of_range(monkeypatch):
    """Every backoff is its upper bound (RetryPolicy draws uniform(0, cap)): pauses become exact."""
    monkeypatch.setattr(random, "uniform", lambda a, b: b)


# ---- answers --------------------------------------------------------------------------------------

def test_answers_come_back_in_the_order_the_server_gives_them_each_with_its_caller_id():
    # The replica answers item k after (5 - k) s: the last item first.
    n = 5
    r = Replica(on_request=lambda call, req: call.later(n - k_of(req), call.score, req))
    got, exc, t = stream(client(r), [item(k) for k in range(n)])
    assert exc is None
    assert [uid for uid, _, _ in got] == [item(k)[0] for k in reversed(range(n))]
    assert [at for _, _, at in got] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert_each_scored_once(got, n)
    assert len(r.calls) == 1 and r.calls[0].half_closed


def test_caller_ids_may_be_any_value_even_repeated_or_unhashable():
    ids = [{"row": 0}, None, {"row": 0}, [1, 2]]
    r = Replica()
    got, exc, _ = stream(client(r), [(uid, [k]) for k, uid in enumerate(ids)])
    assert exc is None
    assert [(uid, res) for uid, res, _ in got] == [(uid, score_of(k)) for k, uid in enumerate(ids)]
    wire = [req.id for _, req in r.calls[0].requests]
    assert len(set(wire)) == len(ids)  # the wire ids are the stream's own, one per item


def test_duplicate_and_unknown_answers_are_ignored():
    def twice(call, req):
        call.score(req)
        call.score(req, value=-1.0)  # a second answer for the same item: not yielded
        call._out.put_nowait(pb.ScoreStreamResponse(id="no such item", score=9.0))

    got, exc, _ = stream(client(Replica(on_request=twice)), [item(k) for k in range(4)])
    assert exc is None
    assert_each_scored_once(got, 4)


def test_no_items_is_a_stream_that_ends_at_once():
    r = Replica()
    got, exc, t = stream(client(r), [])
    assert (got, exc, t) == ([], None, 0.0)


def test_async_iterable_items_and_a_failing_caller_iterator():
    async def items():
        for k in range(3):
            yield item(k)
            await asyncio.sleep(1)
        raise ValueError("the caller's data ran out badly")

    got, exc, t = stream(client(Replica()), items())
    assert isinstance(exc, ValueError) and "badly" in str(exc)
    assert_each_scored_once(got, 3)


def test_at_most_max_in_flight_items_are_unanswered_on_the_wire():
    outstanding, peak = set(), [0]

    def slow(call, req):
        outstanding.add(req.id)
        peak[0] = max(peak[0], len(outstanding))
        call.later(1.0, lambda: (outstanding.discard(req.id), call.score(req)))

    got, exc, t = stream(client(Replica(on_request=slow), max_in_flight=2), [item(k) for k in range(6)])
    assert exc is None and peak[0] == 2
    assert_each_scored_once(got, 6)
    assert t == 3.0  # 6 items, 2 at a time, 1 s each


# ---- UNAVAILABLE: move on to another call ---------------------------------------------------------

def test_an_item_refused_as_unavailable_moves_every_unanswered_item_to_a_new_call(top_of_range):
    # Call 0 (a draining replica) scores item 0, refuses item 1 as UNAVAILABLE, leaves 2 and 3 unanswered.
    def draining(call, req):
        if call is r.calls[0]:
            if len(call.requests) == 4:
                call.score(call.requests[0][1])
                call.refuse(call.requests[1][1], UNAVAILABLE, "draining")
        else:
            call.score(req)

    r = Replica(on_request=draining)
    c = client(r, retry=RetryPolicy(initial_backoff_s=0.25))
    got, exc, _ = stream(c, [item(k) for k in range(4)])
    assert exc is None
    assert_each_scored_once(got, 4)
    assert len(r.calls) == 2 and r.calls[0].cancelled
    assert sorted(r.calls[1].ks) == [1, 2, 3]  # item 0 was answered: not sent again
    # the same wire ids, so an answer from either call settles the item once
    assert {q.id for _, q in r.calls[1].requests} == {q.id for _, q in r.calls[0].requests[1:]}
    assert r.calls[1].opened_at == 0.25 and c.stream_restarts == 1


def test_a_broken_call_is_reopened_after_a_backoff_with_the_unanswered_items(top_of_range):
    def breaks_after_one(call, req):
        if call is r.calls[0]:
            if len(call.requests) == 3:
                call.score(call.requests[0][1])
                call.later(0.5, call.fail, grpc.StatusCode.UNAVAILABLE, "Socket closed")
        else:
            call.score(req)

    r = Replica(on_request=breaks_after_one)
    c = client(r, retry=RetryPolicy(initial_backoff_s=0.1))
    got, exc, t = stream(c, [item(k) for k in range(3)])
    assert exc is None
    assert_each_scored_once(got, 3)
    assert len(r.calls) == 2 and sorted(r.calls[1].ks) == [1, 2]
    assert r.calls[1].opened_at == pytest.approx(0.5 + 0.1)


def test_a_call_the_server_ends_with_items_unanswered_is_reopened_too():
    def ends_early(call, req):
        if call is r.calls[0]:
            if len(call.requests) == 2:
                call.score(call.requests[0][1])
                call.end()
        else:
            call.score(req)

    r = Replica(on_request=ends_early)
    got, exc, _ = stream(client(r, retry=RetryPolicy(initial_backoff_s=0.0)), [item(k) for k in range(2)])
    assert exc is None
    assert_each_scored_once(got, 2)
    assert len(r.calls) == 2 and r.calls[1].ks == [1]


@pytest.mark.parametrize("code, details", [
    # grpcio's asyncio client reads "Internal error from Core" (INTERNAL) when a write fails because
    # the server ended the call (a draining replica's UNAVAILABLE lost client-side): a CI run failed a
    # stream on it.
    (grpc.StatusCode.INTERNAL, "Internal error from Core"),
    # A server shutting down cancels the calls still open when its grace runs out; a stream is open
    # until the client half-closes, so a draining replica's stream ends so (a CI run, cpp-grpc).
    (grpc.StatusCode.CANCELLED, "CANCELLED"),
], ids=["internal-lost-status", "cancelled-by-server"])
def test_a_call_ended_under_the_client_by_the_server_is_reopened(code, details):
    # The call is reopened with what is unanswered, as on UNAVAILABLE.
    def lost_status(call, req):
        if call is r.calls[0]:
            if len(call.requests) == 2:
                call.score(call.requests[0][1])
                call.fail(code, details)
        else:
            call.score(req)

    r = Replica(on_request=lost_status)
    got, exc, _ = stream(client(r, retry=RetryPolicy(initial_backoff_s=0.0)), [item(k) for k in range(2)])
    assert exc is None
    assert_each_scored_once(got, 2)
    assert len(r.calls) == 2 and r.calls[1].ks == [1]


def test_a_servers_own_internal_error_ends_the_stream():
    r = Replica(on_request=lambda call, req: call.fail(grpc.StatusCode.INTERNAL, "batch failed: onnxruntime error"))
    c = client(r, retry=RetryPolicy(initial_backoff_s=0.0))
    got, exc, _ = stream(c, [item(k) for k in range(2)])
    assert got == [] and isinstance(exc, RewardServerError) and exc.code == "INTERNAL", (got, exc)
    assert len(r.calls) == 1 and "batch failed" in exc.message


def test_calls_broken_in_a_row_give_up_after_max_attempts(top_of_range):
    r = Replica(on_request=lambda call, req: call.fail(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    c = client(r, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.1))
    got, exc, t = stream(c, [item(k) for k in range(2)])
    assert got == []
    assert isinstance(exc, Unavailable) and exc.attempts == 3 and "connection refused" in exc.message
    assert len(r.calls) == 3 and c.stream_restarts == 3
    assert [call.opened_at for call in r.calls] == pytest.approx([0.0, 0.1, 0.1 + 0.2])


def test_an_answer_between_breaks_resets_the_count(top_of_range):
    # Every call scores one item then breaks: 2 breaks in a row would end the stream, but each call
    # answers something, so all 4 items are scored over 4 calls.
    def one_then_break(call, req):
        call.score(req)
        call.fail(grpc.StatusCode.UNAVAILABLE, "replica lost")

    r = Replica(on_request=one_then_break)
    got, exc, _ = stream(client(r, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.0)),
                         [item(k) for k in range(4)])
    assert exc is None
    assert_each_scored_once(got, 4)
    assert [call.ks for call in r.calls[:4]] == [[0], [1], [2], [3]]


# ---- RESOURCE_EXHAUSTED: again on the same call, after a backoff ----------------------------------

def test_an_item_refused_as_overloaded_is_resent_on_the_same_call_after_a_backoff(top_of_range):
    refused = set()

    def once_overloaded(call, req):
        if k_of(req) == 1 and k_of(req) not in refused:
            refused.add(1)
            call.refuse(req, RESOURCE_EXHAUSTED, "queue full")
        else:
            call.score(req)

    r = Replica(on_request=once_overloaded)
    got, exc, _ = stream(client(r, retry=RetryPolicy(initial_backoff_s=0.2)), [item(k) for k in range(3)])
    assert exc is None
    assert_each_scored_once(got, 3)
    assert len(r.calls) == 1
    sends = [(t, req.id) for t, req in r.calls[0].requests if k_of(req) == 1]
    assert len(sends) == 2 and sends[0][1] == sends[1][1] and sends[1][0] - sends[0][0] == pytest.approx(0.2)


@pytest.mark.parametrize("errors", ["yield", "raise"])
def test_an_item_overloaded_every_time_fails_after_max_attempts(errors, top_of_range):
    def overloaded(call, req):
        if k_of(req) == 1:
            call.refuse(req, RESOURCE_EXHAUSTED, "queue full")
        else:
            call.score(req)

    r = Replica(on_request=overloaded)
    got, exc, _ = stream(client(r, retry=RetryPolicy(max_attempts=3)), [item(k) for k in range(3)], errors=errors)
    assert r.calls[0].ks.count(1) == 3 and len(r.calls) == 1
    err = exc if errors == "raise" else dict((uid, res) for uid, res, _ in got)[item(1)[0]]
    assert isinstance(err, Overloaded) and err.attempts == 3 and err.item_id == item(1)[0]
    if errors == "yield":
        assert exc is None and len(got) == 3
        assert_each_scored_once([g for g in got if g[0] != item(1)[0]] + [(item(1)[0], score_of(1), 0)], 3)


# ---- refused for good -----------------------------------------------------------------------------

def bad_item_2(call, req):
    if k_of(req) == 2:
        call.refuse(req, INVALID_ARGUMENT, "token id 2 is bad")
    else:
        call.score(req)


def test_errors_yield_puts_the_typed_error_in_place_of_the_score_and_goes_on():
    r = Replica(on_request=bad_item_2)
    got, exc, _ = stream(client(r), [item(k) for k in range(4)], errors="yield")
    assert exc is None and len(got) == 4
    by_id = {uid: res for uid, res, _ in got}
    err = by_id.pop(item(2)[0])
    assert isinstance(err, InvalidInput) and err.item_id == item(2)[0] and err.attempts == 1
    assert "token id 2 is bad" in err.message
    assert by_id == {item(k)[0]: score_of(k) for k in (0, 1, 3)}
    assert r.calls[0].ks.count(2) == 1  # never re-sent


def test_errors_raise_ends_the_stream_with_the_typed_error_and_its_item_id():
    got, exc, _ = stream(client(Replica(on_request=bad_item_2)), [item(k) for k in range(4)])
    assert isinstance(exc, InvalidInput) and exc.item_id == item(2)[0]
    assert [uid for uid, _, _ in got] == [item(k)[0] for k in (0, 1)]


# ---- deadlines ------------------------------------------------------------------------------------

def test_an_item_unanswered_for_the_clients_timeout_ends_the_stream():
    # A replica that never answers item 1 (hung on it) keeps the call open and silent.
    r = Replica(on_request=lambda call, req: None if k_of(req) == 1 else call.score(req))
    got, exc, t = stream(client(r, timeout_s=2.0), [item(k) for k in range(3)])
    assert isinstance(exc, DeadlineExceeded) and exc.item_id == item(1)[0] and "within 2.0 s" in exc.message
    assert 2.0 <= t <= 2.05
    assert sorted(uid for uid, _, _ in got) == [item(0)[0], item(2)[0]]


def test_the_item_timeout_runs_from_each_items_own_send():
    # One item at a time, each answered 1.5 s after it is sent, under a 2 s item timeout: 6 s in all, no error.
    r = Replica(on_request=lambda call, req: call.later(1.5, call.score, req))
    got, exc, t = stream(client(r, timeout_s=2.0, max_in_flight=1), [item(k) for k in range(4)])
    assert exc is None and t == 6.0
    assert_each_scored_once(got, 4)


def test_the_streams_deadline_covers_every_call_and_backoff(top_of_range):
    # Call 0 breaks at 1 s; call 1 gets what is left of the 5 s and the replica goes silent.
    def breaks_then_silent(call, req):
        if call is r.calls[0] and len(call.requests) == 2:
            call.later(1.0, call.fail, grpc.StatusCode.UNAVAILABLE, "replica lost")

    r = Replica(on_request=breaks_then_silent)
    c = client(r, retry=RetryPolicy(initial_backoff_s=0.5))
    got, exc, t = stream(c, [item(k) for k in range(2)], timeout_s=5.0)
    assert got == [] and isinstance(exc, DeadlineExceeded)
    assert [call.timeout for call in r.calls] == pytest.approx([5.0, 5.0 - 1.0 - 0.5])
    assert t == pytest.approx(5.0)


def test_the_item_timeout_runs_from_the_first_send_across_resends(top_of_range):
    # Item 0 is refused as overloaded after 1.5 s, re-sent at 1.7 s and then never answered: the 2 s
    # run from its first send (t = 0), so the stream ends at 2 s, not 2 s after the re-send.
    def overloaded_then_silent(call, req):
        if len(call.requests) == 1:
            call.later(1.5, call.refuse, req, RESOURCE_EXHAUSTED, "queue full")

    r = Replica(on_request=overloaded_then_silent)
    got, exc, t = stream(client(r, timeout_s=2.0, retry=RetryPolicy(initial_backoff_s=0.2)), [item(0)])
    assert [at for at, _ in r.calls[0].requests] == pytest.approx([0.0, 1.7])
    assert isinstance(exc, DeadlineExceeded) and exc.item_id == item(0)[0] and exc.attempts == 2
    assert 2.0 <= t <= 2.05


# ---- the HTTP stream: small batches, each under the retry policy ------------------------------------

class Batches:
    """`_score_once` of an AsyncHttpRewardClient (the one request the HTTP stream sends per batch):
    records each batch (when, the item numbers, the `left` it was given) and answers as `answer` says."""

    def __init__(self, answer=None, takes_s: float = 0.0):
        self.sent: list[tuple[float, list[int], float | None]] = []
        self.answer, self.takes_s = answer, takes_s

    async def __call__(self, seqs, truncation, timeout_s):
        ks = [s[0] for s in seqs]
        self.sent.append((virtual_time.now(), ks, timeout_s))
        if self.takes_s:
            await asyncio.sleep(self.takes_s)
        if self.answer is not None:
            self.answer(ks, len(self.sent))
        return [score_of(k) for k in ks], "v1", (1.0, 1.0, 0.0)


def http_client(batches: Batches, **kw):
    from rmscore_client import AsyncHttpRewardClient

    kw.setdefault("timeout_s", None)
    c = AsyncHttpRewardClient("http://fake:1", **kw)
    c._score_once = batches
    return c


def test_http_items_are_gathered_into_batches_of_chunk_size_and_each_answered_once():
    b = Batches()
    got, exc, _ = stream(http_client(b, chunk_size=3), [item(k) for k in range(7)])
    assert exc is None
    assert_each_scored_once(got, 7)
    assert [ks for _, ks, _ in b.sent] == [[0, 1, 2], [3, 4, 5], [6]]


def test_http_a_batch_refused_as_invalid_is_resent_item_by_item_so_only_the_bad_one_fails():
    def invalid_with_2(ks, _):
        if 2 in ks:
            raise InvalidInput("INVALID_ARGUMENT", "token id 2 is bad")

    b = Batches(invalid_with_2)
    got, exc, _ = stream(http_client(b, chunk_size=4), [item(k) for k in range(4)], errors="yield")
    assert exc is None and len(got) == 4
    by_id = {uid: res for uid, res, _ in got}
    err = by_id.pop(item(2)[0])
    assert isinstance(err, InvalidInput) and err.item_id == item(2)[0]
    assert by_id == {item(k)[0]: score_of(k) for k in (0, 1, 3)}
    assert sorted(map(tuple, (ks for _, ks, _ in b.sent))) == [(0,), (0, 1, 2, 3), (1,), (2,), (3,)]


def test_http_an_overloaded_batch_is_retried_after_a_backoff(top_of_range):
    def overloaded_once(ks, n):
        if n == 1:
            raise Overloaded("RESOURCE_EXHAUSTED", "queue full")

    b = Batches(overloaded_once)
    got, exc, _ = stream(http_client(b, chunk_size=2, retry=RetryPolicy(initial_backoff_s=0.3)),
                         [item(k) for k in range(2)])
    assert exc is None
    assert_each_scored_once(got, 2)
    assert [(t, ks) for t, ks, _ in b.sent] == [(0.0, [0, 1]), (pytest.approx(0.3), [0, 1])]


def test_http_each_batch_gets_what_is_left_of_the_streams_deadline():
    async def items():
        for k in range(2):
            yield item(k)
            await asyncio.sleep(1.0)

    b = Batches()
    got, exc, _ = stream(http_client(b, chunk_size=1), items(), timeout_s=5.0)
    assert exc is None
    assert [left for _, _, left in b.sent] == pytest.approx([5.0, 4.0])


def test_http_a_batch_answered_with_too_few_scores_fails_every_item():
    class Short(Batches):
        async def __call__(self, seqs, truncation, timeout_s):
            scores, version, timings = await super().__call__(seqs, truncation, timeout_s)
            return scores[:-1], version, timings

    got, exc, _ = stream(http_client(Short(), chunk_size=3), [item(k) for k in range(3)], errors="yield")
    assert exc is None
    assert sorted(uid for uid, _, _ in got) == [item(k)[0] for k in range(3)]
    assert all(isinstance(x, RewardServerError) and x.code == "INTERNAL" for _, x, _ in got), got
