"""The retry and deadline policy of every client call, whatever the transport.

A call is re-sent after an exponential, jittered backoff (`RetryPolicy`) when it fails
with a retryable error (UNAVAILABLE, RESOURCE_EXHAUSTED); every other failure is
final at once. One deadline covers every attempt and every backoff.

Time is the running event loop's clock (`now()`; `time.monotonic` under asyncio's own loops),
so a test can run the policy on a loop whose clock it drives, with no real waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .errors import DeadlineExceeded, RewardServerError
from .types import RetryPolicy

T = TypeVar("T")


def now() -> float:
    """The running loop's clock, which its sleeps and timeouts use (time.monotonic by default)."""
    return asyncio.get_running_loop().time()


async def with_retry(fn: Callable[[float | None], Awaitable[T]], timeout_s: float | None,
                     retry: RetryPolicy) -> tuple[T, int]:
    """Run `fn(remaining_s)` until it succeeds, fails for good, or the deadline passes.

    Returns (result, attempts). The deadline covers every attempt and backoff."""
    deadline = None if timeout_s is None else now() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        left = None if deadline is None else deadline - now()
        if left is not None and left <= 0:
            raise DeadlineExceeded("DEADLINE_EXCEEDED", f"deadline of {timeout_s} s passed after "
                                   f"{attempt - 1} attempts", attempts=attempt - 1)
        try:
            return await fn(left), attempt
        except RewardServerError as e:
            e.attempts = attempt
            if not e.retryable or not retry.retries_after(attempt, deadline is not None):
                raise
            pause = retry.backoff(attempt)
            if deadline is not None and now() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
