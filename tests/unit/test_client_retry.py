"""rmscore_client.policy.with_retry and RetryPolicy, with no server and no real waits: each call
runs on a loop whose clock the test drives (virtual_time), so every attempt's start, every
backoff and every deadline is an exact instant."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from rmscore_client import errors
from rmscore_client.errors import (Cancelled, DeadlineExceeded, InternalError, InvalidInput, MessageTooLarge,
                                   Overloaded, RewardServerError, Unauthenticated, Unavailable)
from rmscore_client.policy import with_retry
from rmscore_client.types import UNBOUNDED_ATTEMPTS, RetryPolicy

import virtual_time


@pytest.fixture
def top_of_range(monkeypatch):
    """Every backoff is its upper bound (the jitter draws uniform(0, cap)): pauses become exact."""
    draws = []

    def uniform(a, b):
        draws.append((a, b))
        return b

    monkeypatch.setattr(random, "uniform", uniform)
    return draws


class Script:
    """The call under retry: each attempt records (its start on the loop clock, the `left` it was given),
    takes `takes_s`, then raises the next of `fails` (or returns "ok" once they run out). Like a gRPC
    call, an attempt given less than `takes_s` ends with DEADLINE_EXCEEDED when its `left` runs out."""

    def __init__(self, fails=(), takes_s=0.0, forever=None):
        self.fails, self.takes_s, self.forever = list(fails), takes_s, forever
        self.calls: list[tuple[float, float | None]] = []
        self.raised: list[BaseException] = []

    async def __call__(self, left):
        self.calls.append((virtual_time.now(), left))
        if self.takes_s:
            await asyncio.sleep(self.takes_s if left is None else min(self.takes_s, left))
            if left is not None and left < self.takes_s:
                raise DeadlineExceeded("DEADLINE_EXCEEDED", "Deadline Exceeded")
        if self.fails or self.forever is not None:
            e = self.fails.pop(0) if self.fails else self.forever()
            self.raised.append(e)
            raise e
        return "ok"

    @property
    def starts(self):
        return [t for t, _ in self.calls]


def run(fn, timeout_s, retry):
    async def go():
        try:
            return await with_retry(fn, timeout_s, retry), virtual_time.now()
        except BaseException as e:  # noqa: BLE001 - handed to the test with the instant it was raised
            return e, virtual_time.now()

    return virtual_time.run(go())


def unavailable():
    return Unavailable("UNAVAILABLE", "replica restarting")


# ---- which failures are retried ---------------------------------------------------------------

def test_first_success_is_one_attempt_with_the_whole_deadline():
    fn = Script()
    (got, t) = run(fn, 3.0, RetryPolicy())
    assert got == ("ok", 1) and t == 0.0
    assert fn.calls == [(0.0, 3.0)]


def test_without_a_deadline_each_attempt_is_given_none():
    fn = Script(fails=[unavailable()])
    (got, _) = run(fn, None, RetryPolicy(initial_backoff_s=0.0))
    assert got == ("ok", 2) and [left for _, left in fn.calls] == [None, None]


class RpcError(grpc.RpcError):
    """What a failed gRPC call raises: a status code and its details."""

    def __init__(self, code: grpc.StatusCode, details: str):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# gRPC core's own refusal of a message over the server's limit (the transport's, before any server code)
SIZE_REFUSAL = RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (5000000 vs. 4194304)")


@pytest.mark.parametrize("err", [Unavailable("UNAVAILABLE", "draining"),
                                 Overloaded("RESOURCE_EXHAUSTED", "queue full")])
def test_unavailable_and_resource_exhausted_are_retried(err, top_of_range):
    fn = Script(fails=[err, err])
    (got, t) = run(fn, 10.0, RetryPolicy())
    assert got == ("ok", 3)
    assert fn.starts == pytest.approx([0.0, 0.05, 0.05 + 0.1]) and t == pytest.approx(0.15)


@pytest.mark.parametrize("err", [
    InvalidInput("INVALID_ARGUMENT", "token id 99999 >= vocab_size"),
    DeadlineExceeded("DEADLINE_EXCEEDED", "server deadline"),
    InternalError("INTERNAL", "model failed"),
    InternalError("UNKNOWN", "?"),
    Unauthenticated("UNAUTHENTICATED", "bad token"),
    Cancelled("CANCELLED", "cancelled"),
    # RESOURCE_EXHAUSTED because one message is too large is not transient: never retried
    errors.from_rpc_error(SIZE_REFUSAL),
    RewardServerError("FAILED_PRECONDITION", "an unmapped code"),
])
def test_every_other_failure_is_final_at_once(err):
    fn = Script(fails=[err, err])
    (got, t) = run(fn, 10.0, RetryPolicy(max_attempts=5))
    assert got is err and got.attempts == 1 and len(fn.calls) == 1 and t == 0.0


def test_the_size_error_is_the_non_retryable_kind():
    e = errors.from_rpc_error(SIZE_REFUSAL)
    assert isinstance(e, MessageTooLarge) and not e.retryable
    # as the Python servers' grpcio words it (the C++ server's gRPC has no prefix)
    python_server = RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER: " + SIZE_REFUSAL.details())
    assert isinstance(errors.from_rpc_error(python_server), MessageTooLarge)
    assert errors.from_rpc_error(RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")).retryable
    # Everywhere else the code decides, not the text: a stream item's RESOURCE_EXHAUSTED is the queue's.
    assert type(errors.from_status_number(8, "Received message larger than max (5 vs. 4)")) is Overloaded


def test_an_error_passed_on_for_one_item_keeps_its_kind():
    """HTTP says 413 (MessageTooLarge); the stream's fallback hands it to each item as it was."""
    e = errors.again(MessageTooLarge("RESOURCE_EXHAUSTED", "body of 9 bytes exceeds max_request_bytes 4", attempts=2),
                     item_id=7)
    assert isinstance(e, MessageTooLarge) and (e.item_id, e.attempts) == (7, 2) and not e.retryable
    assert type(errors.again(RewardServerError("INTERNAL", "3 scores for 4"), item_id=1)) is InternalError


def test_an_exception_that_is_no_server_error_is_not_retried():
    fn = Script(fails=[ValueError("a bug in the caller")])
    (got, _) = run(fn, 10.0, RetryPolicy(max_attempts=5))
    assert isinstance(got, ValueError) and len(fn.calls) == 1


# ---- backoff ------------------------------------------------------------------------------------

def test_backoff_doubles_from_initial_up_to_the_cap(top_of_range):
    p = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.3, multiplier=2.0)
    assert [p.backoff(k) for k in range(1, 6)] == pytest.approx([0.05, 0.1, 0.2, 0.3, 0.3])
    assert all(a == 0 for a, _ in top_of_range)  # full jitter: from 0 up to the cap


def test_backoff_is_jittered_within_its_bounds():
    random.seed(7)
    p = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=2.0, multiplier=2.0)
    for k in range(1, 10):
        cap = min(2.0, 0.05 * 2 ** (k - 1))
        pauses = [p.backoff(k) for _ in range(200)]
        assert all(0 <= x <= cap for x in pauses), k
        assert max(pauses) > cap / 2, k  # it spreads over the range, not a constant


def test_the_pause_between_attempts_is_the_backoff_of_the_failed_attempt(top_of_range):
    fn = Script(fails=[unavailable() for _ in range(4)], takes_s=0.01)
    (got, _) = run(fn, None, RetryPolicy(max_attempts=5, initial_backoff_s=0.1, max_backoff_s=0.25))
    assert got == ("ok", 5)
    gaps = [b - a for a, b in zip(fn.starts, fn.starts[1:])]
    assert gaps == pytest.approx([0.01 + 0.1, 0.01 + 0.2, 0.01 + 0.25, 0.01 + 0.25])


# ---- giving up ----------------------------------------------------------------------------------

def test_max_attempts_then_the_last_error_with_its_count(top_of_range):
    fn = Script(forever=unavailable)
    (got, _) = run(fn, 60.0, RetryPolicy(max_attempts=3))
    assert len(fn.calls) == 3
    assert got is fn.raised[-1] and isinstance(got, Unavailable) and got.attempts == 3


def test_max_attempts_one_turns_retries_off():
    fn = Script(forever=unavailable)
    (got, _) = run(fn, 60.0, RetryPolicy(max_attempts=1))
    assert len(fn.calls) == 1 and got.attempts == 1


def test_without_deadline_or_max_attempts_it_stops_after_the_unbounded_default():
    fn = Script(forever=unavailable)
    (got, _) = run(fn, None, RetryPolicy(initial_backoff_s=0.0))
    assert len(fn.calls) == UNBOUNDED_ATTEMPTS and got.attempts == UNBOUNDED_ATTEMPTS


def test_with_a_deadline_it_retries_until_the_next_pause_would_pass_it(top_of_range):
    # Pauses 0.05, 0.1, 0.2, 0.4 end at 0.75; the next (0.8) would end past 1.0: give up at 0.75,
    # without sleeping into the deadline, with the last attempt's error.
    fn = Script(forever=unavailable)
    (got, t) = run(fn, 1.0, RetryPolicy())
    assert fn.starts == pytest.approx([0.0, 0.05, 0.15, 0.35, 0.75])
    assert t == pytest.approx(0.75)
    assert isinstance(got, Unavailable) and got is fn.raised[-1] and got.attempts == 5


def test_each_attempt_is_given_what_is_left_of_the_one_deadline(top_of_range):
    fn = Script(fails=[unavailable(), unavailable()], takes_s=0.2)
    (got, t) = run(fn, 2.0, RetryPolicy())
    assert got == ("ok", 3) and t == pytest.approx(0.2 + 0.05 + 0.2 + 0.1 + 0.2)
    assert [left for _, left in fn.calls] == pytest.approx([2.0, 2.0 - 0.25, 2.0 - 0.55])


def test_the_deadline_bounds_retries_even_when_max_attempts_is_high(top_of_range):
    # Attempts of 0.3 s, failing at 0.3, 0.65, 1.05, 1.55; the fifth starts at 1.95 with 0.05 s left
    # and its transport ends it at the deadline: DEADLINE_EXCEEDED, final.
    fn = Script(forever=unavailable, takes_s=0.3)
    (got, t) = run(fn, 2.0, RetryPolicy(max_attempts=100))
    assert fn.starts == pytest.approx([0.0, 0.35, 0.75, 1.25, 1.95]) and fn.calls[-1][1] == pytest.approx(0.05)
    assert isinstance(got, DeadlineExceeded) and got.attempts == 5 and t == pytest.approx(2.0)


def test_a_deadline_already_passed_sends_nothing():
    fn = Script()
    (got, _) = run(fn, 0.0, RetryPolicy())
    assert isinstance(got, DeadlineExceeded) and got.attempts == 0 and fn.calls == []


# ---- RetryPolicy itself -------------------------------------------------------------------------

def test_retries_after():
    assert RetryPolicy(max_attempts=3).retries_after(2, True) and not RetryPolicy(max_attempts=3).retries_after(3, True)
    assert RetryPolicy().retries_after(1000, deadline_bound=True)
    assert RetryPolicy().retries_after(UNBOUNDED_ATTEMPTS - 1, False)
    assert not RetryPolicy().retries_after(UNBOUNDED_ATTEMPTS, False)


@pytest.mark.parametrize("kw", [{"max_attempts": 0}, {"initial_backoff_s": -1}, {"max_backoff_s": -1},
                                {"multiplier": 0.5}])
def test_bad_policies_are_refused(kw):
    with pytest.raises(ValueError):
        RetryPolicy(**kw)
