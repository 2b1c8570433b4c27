"""Liveness: is the batcher making progress while work waits? (docs/contract.md, "Liveness")

A hung server used to stay live: the probes asked the metrics endpoint, which its own thread serves
whatever the batcher does, so a deadlocked batcher or a model run that never returns (a stuck device)
kept answering and a restart never came. Here the batcher tells a `StallClock` when work starts
waiting and when batches start and end; the clock says for how long the batcher has made no
progress; `Liveness` holds that against --liveness-stall-seconds; the gauge
rmscore_batcher_stalled_seconds, gRPC health "liveness" (through `LivenessWatch`) and HTTP /livez
report it.

What counts as progress is a batch *completing* (scored or failed: either way its requests are
answered), not a batch starting: a run that never returns has started, and the batcher thread that
started it plans nothing more, so completions are what a hung model stops. The stall is counted

  - from the later of the last completion and the moment work started waiting after an idle spell
    (so an idle server that gets one request is not "stalled since the last batch an hour ago"), and
  - from the start of the oldest batch still running, when that is earlier: with several model
    workers, one stuck run must show even while the other workers keep completing batches;

and is 0 while nothing is queued and no batch runs. A legitimate batch counts for at most its own
run time (plus the planner's wait for partners, --max-queue-delay-ms), which is why the threshold
must stay well above the longest batch the limits allow (`longest_batch`, said at start-up).

server_cpp/src/liveness.{h,cc} is this file in C++, with the same names and rules.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from rmscore.core.config import ConfigError
from rmscore.core.cost import CostTable

#: The grpc.health.v1 service name that answers liveness (Kubernetes' `grpc: {service: liveness}`);
#: "" stays readiness.
LIVENESS_SERVICE = "liveness"


def now_us() -> int:
    """The clock every caller of StallClock passes: time.monotonic, in microseconds (the batcher's)."""
    return time.monotonic_ns() // 1000


@dataclass(frozen=True)
class Stall:
    stalled_us: int  # no progress for this long while work waits; 0 when idle or progressing
    queued: int  # sequences waiting for a batch
    running: int  # batches in a model run


class StallClock:
    """How long the batcher has made no progress while work waits.

    Writers: the batcher, holding its own lock, so its calls come one at a time and in order. Readers:
    any thread, at any time. The clock's own lock is held only inside these methods, which call
    nothing: a reader is never blocked by a batcher stuck while holding the batcher's lock. Every time
    is passed in (`now_us()` in the server), so the tests need no sleeping."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued = 0
        self._running: list[int] = []  # start times of the batches running, ascending
        self._since_us: int | None = None  # the progress mark; None exactly while no work waits

    def queue_changed(self, now_us: int, queued: int) -> None:
        """`queued` sequences wait for a batch from now on."""
        with self._lock:
            self._queued = queued
            self._mark_locked(now_us)

    def batch_started(self, now_us: int, queued: int) -> None:
        """A batch went into a model run; `queued` sequences are left waiting."""
        with self._lock:
            bisect.insort(self._running, now_us)
            self._queued = queued
            self._mark_locked(now_us)

    def batch_ended(self, started_us: int, now_us: int, queued: int) -> None:
        """The batch announced by `batch_started(started_us, ...)` completed (scored or failed: either
        way its requests are answered), which is progress; `queued` sequences wait."""
        with self._lock:
            self._running.remove(started_us)
            self._queued = queued
            self._since_us = now_us
            self._mark_locked(now_us)

    def _mark_locked(self, now_us: int) -> None:
        """Precondition: _lock held. Work waiting after an idle spell is counted from now; none: no mark."""
        if not self._queued and not self._running:
            self._since_us = None
        elif self._since_us is None:
            self._since_us = now_us

    def read(self, now_us: int) -> Stall:
        with self._lock:
            if self._since_us is None:
                return Stall(0, self._queued, len(self._running))
            start = min(self._since_us, self._running[0]) if self._running else self._since_us
            return Stall(max(0, now_us - start), self._queued, len(self._running))

    def stalled_us(self, now_us: int) -> int:
        return self.read(now_us).stalled_us


def _log(message: str, warning: bool) -> None:
    print(message, file=sys.stderr if warning else sys.stdout, flush=True)


class Liveness:
    """The verdict: alive unless the stall passed `threshold_s` (0: always alive). Says one line when
    it changes: a warning, with the seconds and the queue, when a stall starts being reported, and a
    line when progress resumes."""

    def __init__(self, clock: StallClock, threshold_s: float,
                 log: Callable[[str, bool], None] = _log):
        self.clock = clock
        self.threshold_s = threshold_s
        self._log = log
        self._lock = threading.Lock()  # orders the verdicts of concurrent checks (a probe and the watch)
        self._alive = True

    def check(self, now: int) -> tuple[bool, Stall]:
        """(alive, the stall it was judged on) at `now` (microseconds, now_us's clock)."""
        stall = self.clock.read(now)
        alive = self.threshold_s == 0 or stall.stalled_us <= self.threshold_s * 1e6
        with self._lock:
            was, self._alive = self._alive, alive
        if was and not alive:
            self._log(f"rmscore WARNING liveness: the batcher made no progress for {stall.stalled_us / 1e6:.1f} s "
                      f"with {stall.queued} sequences queued and {stall.running} batches running "
                      f"(--liveness-stall-seconds {self.threshold_s:g}): liveness fails until a batch completes",
                      True)
        elif alive and not was:
            self._log("rmscore liveness: the batcher makes progress again; liveness passes", False)
        return alive, stall


class LivenessWatch:
    """A thread that checks `liveness` every `period_s` and calls `on_change(alive)` when the verdict
    changes (gRPC: the health service's "liveness" status, which Check and Watch then answer). It
    reads only the StallClock, so it keeps answering while the batcher is stuck. The verdict starts
    alive, as the server announces it at start."""

    #: A probe sees a stall at most this long after the threshold passes.
    PERIOD_S = 0.25

    def __init__(self, liveness: Liveness, on_change: Callable[[bool], None] | None = None,
                 period_s: float = PERIOD_S):
        self._liveness = liveness
        self._on_change = on_change
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmscore-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        alive = True
        while not self._stop.wait(self._period_s):
            now_alive, _ = self._liveness.check(now_us())
            if now_alive != alive and self._on_change is not None:
                try:
                    self._on_change(now_alive)
                except Exception as e:  # noqa: BLE001 - a failed status update must not end the watch
                    _log(f"rmscore liveness: could not report the verdict: {e!r}", True)
                    continue  # not recorded: tried again on the next check
            alive = now_alive


def longest_batch(table: CostTable, max_batch_size: int, max_batch_tokens: int,
                  max_length: int) -> tuple[int, int, int]:
    """(predicted microseconds, sequences, padded length) of the costliest batch the limits allow: B
    sequences padded to min(max_length, max_batch_tokens // B) tokens, or one sequence of max_length
    (a sequence longer than the token bound still runs, alone). What the threshold must stay above."""
    best = (0, 1, max_length)
    for b in range(1, max_batch_size + 1):
        n = max_length if b == 1 else min(max_length, max_batch_tokens // b)
        if n < 1:
            break
        best = max(best, (table.batch_us(b, n), b, n))
    return best


def threshold_note(threshold_s: float, longest: tuple[int, int, int] | None) -> tuple[str, bool]:
    """The start-up line about liveness, and whether it is a warning: a threshold under three times the
    longest batch the limits allow could take a slow batch for a hang."""
    if threshold_s == 0:
        return "rmscore liveness: --liveness-stall-seconds 0: liveness never fails", False
    line = f"rmscore liveness: fails after {threshold_s:g} s with work waiting and no batch completing"
    if longest is None:
        return line, False
    us, b, n = longest
    line += f"; the longest batch the limits allow ({b} x {n} tokens) is predicted at {us / 1e6:.2f} s here"
    if threshold_s * 1e6 < 3 * us:
        return (f"rmscore WARNING liveness: --liveness-stall-seconds {threshold_s:g} is under 3 x the longest "
                f"batch the limits allow ({b} x {n} tokens, predicted {us / 1e6:.2f} s here): a slow batch may "
                f"be taken for a hang"), True
    return line, False


# ---- fault injection, for tests only ------------------------------------------------------------------

#: "K:S": the K-th batch the batcher runs (counted from 1 over every model worker; warm-up, cost
#: measurement and self-check runs are not batches) blocks S seconds before its model run, as a stuck
#: device would. Read once, when the server starts; a value that does not parse refuses the start
#: (exit 2). The hang is not interrupted by a drain. For tests of liveness (tests/conformance/
#: test_liveness.py) against a real server: never set it in production.
HANG_BATCH_ENV = "RMSCORE_FAULT_HANG_BATCH"


@dataclass(frozen=True)
class HangFault:
    batch: int = 0  # 0: no fault
    seconds: float = 0.0

    @staticmethod
    def parse(value: str) -> "HangFault":
        """RMSCORE_FAULT_HANG_BATCH's value; ConfigError quoting it when it does not parse. The same
        rule and message as server_cpp's ParseHangFault."""
        k, sep, s = value.partition(":")
        try:
            fault = HangFault(int(k), float(s)) if sep and k.isascii() and k.isdigit() else None
        except ValueError:
            fault = None
        if fault is None or fault.batch < 1 or not 0 < fault.seconds <= 86400:
            raise ConfigError(f"{HANG_BATCH_ENV}: must be K:SECONDS (the K-th batch, K >= 1, hangs 0 < SECONDS "
                              f"<= 86400), got {value!r}")
        return fault

    @staticmethod
    def from_env(environ: Mapping[str, str] = os.environ) -> "HangFault":
        value = environ.get(HANG_BATCH_ENV)
        return HangFault() if value is None or value == "" else HangFault.parse(value)


class HangHook:
    """Runs before every batch's model run (any worker); blocks the batch `fault` names."""

    def __init__(self, fault: HangFault, sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str, bool], None] = _log):
        self.fault = fault
        self._sleep = sleep
        self._log = log
        self._lock = threading.Lock()  # model workers count batches together
        self._batches = 0
        if fault.batch:
            log(f"rmscore FAULT INJECTION ({HANG_BATCH_ENV}): batch {fault.batch} will hang {fault.seconds:g} s; "
                f"for tests only", True)

    def before_batch(self) -> None:
        if not self.fault.batch:
            return
        with self._lock:
            self._batches += 1
            hang = self._batches == self.fault.batch
        if hang:
            self._log(f"rmscore FAULT INJECTION: batch {self.fault.batch} hangs {self.fault.seconds:g} s", True)
            self._sleep(self.fault.seconds)
