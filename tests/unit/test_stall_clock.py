"""Liveness (core/liveness.py): the stall clock with times passed in, the verdict and its log lines, the
scrape-time gauge, the flag, the fault-injection hook, and the batcher telling the clock. No sleeping:
times are injected and model runs are held by a gate. Each case has a namesake in
server_cpp/tests/test_liveness.cc (the C++ twin), and the other way round."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rmscore.core.batcher import Batcher, Job
from rmscore.core.config import ConfigError, ServeConfig
from rmscore.core.cost import CostTable
from rmscore.core.liveness import (HANG_BATCH_ENV, HangFault, HangHook, Liveness, LivenessWatch, Stall, StallClock,
                                   longest_batch, now_us, threshold_note)
from rmscore.core.metrics import Metrics
from rmscore.core.planner import FIFO, PlannerConfig

S = 1_000_000  # microseconds


# ---- the stall clock ---------------------------------------------------------------------------------

def test_idle_is_never_stalled_however_long_since_the_last_batch():
    c = StallClock()
    assert c.stalled_us(10 * S) == 0
    c.queue_changed(0, 1)
    c.batch_started(1, 0)
    c.batch_ended(1, 2 * S, 0)
    assert c.stalled_us(3600 * S) == 0  # an hour idle after the last batch
    # Work arriving after the idle spell is counted from its arrival, not from the last batch.
    c.queue_changed(3600 * S, 2)
    assert c.stalled_us(3601 * S) == S


def test_counts_from_arrival_while_the_batch_runs_and_resets_on_completion():
    c = StallClock()
    c.queue_changed(100, 1)
    c.batch_started(120, 0)  # the batch took it: nothing queued, one running
    st = c.read(5 * S)
    assert (st.stalled_us, st.queued, st.running) == (5 * S - 100, 0, 1)
    c.queue_changed(S, 3)  # arrivals while it runs do not restart the count
    assert c.stalled_us(5 * S) == 5 * S - 100
    c.batch_ended(120, 6 * S, 3)  # completion is progress: counted from it while work still waits
    assert c.stalled_us(7 * S) == S
    c.queue_changed(7 * S, 0)
    assert c.stalled_us(8 * S) == 0


def test_a_failed_batch_is_progress_too():
    # The batcher reports every run's end, scored or failed (its requests are answered either way).
    c = StallClock()
    c.queue_changed(0, 2)
    c.batch_started(0, 1)
    c.batch_ended(0, 4 * S, 1)
    assert c.stalled_us(4 * S) == 0


def test_a_backlog_of_long_batches_stalls_no_longer_than_one_batch():
    # One worker, a steady backlog, 5 s batches back to back: never more than one batch's time.
    c = StallClock()
    c.queue_changed(0, 100)
    t = 0
    worst = 0
    for _ in range(10):
        c.batch_started(t, 90)
        worst = max(worst, c.stalled_us(t + 5 * S))
        c.batch_ended(t, t + 5 * S, 90)
        t += 5 * S
    assert worst == 5 * S


def test_one_stuck_worker_shows_while_another_keeps_completing():
    c = StallClock()
    c.queue_changed(0, 10)
    c.batch_started(0, 9)  # worker A: never ends
    t = 0
    for _ in range(30):  # worker B: a batch a second
        c.batch_started(t, 8)
        c.batch_ended(t, t + S, 8)
        t += S
    assert c.stalled_us(t) == t  # since A's batch started, not since B's last completion


def test_two_batches_started_at_the_same_microsecond_end_one_at_a_time():
    c = StallClock()
    c.queue_changed(0, 2)
    c.batch_started(5, 1)
    c.batch_started(5, 0)
    c.batch_ended(5, S, 0)
    assert c.read(2 * S).running == 1 and c.stalled_us(2 * S) == 2 * S - 5  # the other still runs
    c.batch_ended(5, 3 * S, 0)
    assert c.stalled_us(4 * S) == 0


# ---- the verdict -------------------------------------------------------------------------------------

class Log:
    def __init__(self):
        self.lines: list[tuple[str, bool]] = []

    def __call__(self, line: str, warning: bool) -> None:
        self.lines.append((line, warning))


def test_liveness_fails_past_the_threshold_and_says_so_once_then_recovers():
    c, log = StallClock(), Log()
    live = Liveness(c, 2.0, log)
    c.queue_changed(0, 3)
    c.batch_started(0, 2)
    assert live.check(2 * S)[0]  # at the threshold: still alive
    alive, stall = live.check(2 * S + 1)
    assert not alive and stall.stalled_us == 2 * S + 1
    assert not live.check(9 * S)[0]
    assert len(log.lines) == 1
    line, warning = log.lines[0]
    assert warning
    assert "no progress for 2.0 s with 2 sequences queued and 1 batches running" in line, line
    assert "--liveness-stall-seconds 2" in line, line
    c.batch_ended(0, 10 * S, 2)
    assert live.check(10 * S)[0]
    assert len(log.lines) == 2 and not log.lines[1][1] and "progress again" in log.lines[1][0]


def test_threshold_zero_never_fails():
    c, log = StallClock(), Log()
    live = Liveness(c, 0.0, log)
    c.queue_changed(0, 1)
    alive, stall = live.check(10_000 * S)
    assert alive and stall.stalled_us == 10_000 * S and log.lines == []


def test_the_watch_reports_each_change_of_verdict():
    c = StallClock()
    changes: list[bool] = []
    seen = threading.Condition()

    def on_change(alive: bool) -> None:
        with seen:
            changes.append(alive)
            seen.notify_all()

    watch = LivenessWatch(Liveness(c, 1.0, Log()), on_change, period_s=0.01)
    watch.start()
    try:
        c.queue_changed(now_us() - 60 * S, 1)  # work has waited a minute
        with seen:
            assert seen.wait_for(lambda: changes == [False], 10), changes
        c.queue_changed(now_us(), 0)
        with seen:
            assert seen.wait_for(lambda: changes == [False, True], 10), changes
    finally:
        watch.stop()


# ---- the threshold against the cost model ----------------------------------------------------------------

TABLE = CostTable.make([1, 2, 4, 8, 16, 32], [16, 64, 256, 512],
                       [[10, 20, 40, 80], [15, 30, 60, 160], [20, 40, 120, 320], [30, 60, 240, 640],
                        [40, 120, 480, 1280], [60, 240, 960, 2560]])


def test_longest_batch_is_the_costliest_shape_the_limits_allow():
    # 8192 tokens: 16 x 512 (1280 us) beats 32 x 256 (960) and 1 x 512 (80).
    assert longest_batch(TABLE, 32, 8192, 512) == (1280, 16, 512)
    # A tiny token bound still lets one sequence of the full length run alone.
    assert longest_batch(TABLE, 32, 64, 512) == (80, 1, 512)


def test_threshold_note_warns_under_three_longest_batches():
    line, warning = threshold_note(300, (5_400_000, 16, 512))
    assert not warning and "5.40 s" in line and "16 x 512" in line
    line, warning = threshold_note(10, (5_400_000, 16, 512))
    assert warning and "--liveness-stall-seconds 10 is under 3 x" in line
    assert threshold_note(0, (5_400_000, 16, 512)) == ("rmscore liveness: --liveness-stall-seconds 0: "
                                                       "liveness never fails", False)
    assert not threshold_note(2, None)[1]  # no cost table (fifo, length_aware): nothing to compare


# ---- the flag ------------------------------------------------------------------------------------------

@pytest.fixture
def model(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    return tmp_path


def test_liveness_stall_seconds_defaults_to_300_and_0_disables(model):
    assert ServeConfig(model=model).liveness_stall_seconds == 300.0
    assert ServeConfig(model=model, liveness_stall_seconds=0.0).liveness_stall_seconds == 0.0
    for bad in (-1.0, 2147484.0, float("nan")):
        with pytest.raises(ConfigError) as e:
            ServeConfig(model=model, liveness_stall_seconds=bad)
        assert str(e.value) == f"--liveness-stall-seconds: must be >= 0 and <= 2147483, got {bad!r}"


# ---- the gauge -----------------------------------------------------------------------------------------

def test_the_stalled_gauge_is_computed_at_each_scrape():
    m = Metrics("test", "v0")
    labels = {"server": "test", "backend": "v0", "device": "cpu"}
    assert m.registry.get_sample_value("rmscore_batcher_stalled_seconds", labels) == 0
    value = [1.5]
    m.set_stalled_source(lambda: value[0])
    assert m.registry.get_sample_value("rmscore_batcher_stalled_seconds", labels) == 1.5
    value[0] = 7.25
    assert m.registry.get_sample_value("rmscore_batcher_stalled_seconds", labels) == 7.25


# ---- the fault-injection hook ---------------------------------------------------------------------------

def test_hang_fault_parses_k_colon_seconds_and_refuses_the_rest_quoting_it():
    assert HangFault.parse("3:2.5") == HangFault(3, 2.5)
    assert HangFault.from_env({}) == HangFault() and HangFault.from_env({HANG_BATCH_ENV: ""}) == HangFault()
    assert HangFault.from_env({HANG_BATCH_ENV: "1:4"}) == HangFault(1, 4.0)
    for bad in ("4", "0:1", "-1:1", "x:1", "1:0", "1:-2", "1:nan", "1:inf", "1:x", ":1", "1:90000"):
        with pytest.raises(ConfigError) as e:
            HangFault.parse(bad)
        assert str(e.value) == (f"{HANG_BATCH_ENV}: must be K:SECONDS (the K-th batch, K >= 1, hangs "
                                f"0 < SECONDS <= 86400), got {bad!r}"), bad


def test_hang_hook_blocks_only_the_kth_batch():
    slept: list[float] = []
    log = Log()
    hook = HangHook(HangFault(2, 4.0), sleep=slept.append, log=log)
    for _ in range(4):
        hook.before_batch()
    assert slept == [4.0]
    assert [w for _, w in log.lines] == [True, True]  # announced at start, and when it fires
    quiet = HangHook(HangFault(), sleep=slept.append, log=log)
    quiet.before_batch()
    assert slept == [4.0] and len(log.lines) == 2


# ---- the batcher tells the clock ------------------------------------------------------------------------

class Held:
    """A one-worker FIFO batcher whose model waits at an event; the stall clock beside it."""

    def __init__(self):
        self.clock = StallClock()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False
        opts = Batcher.Options(PlannerConfig(8, 1 << 20, 0, FIFO), progress=self.clock)
        self.batcher = Batcher(opts, self.model, Metrics("test", "v0"))

    def model(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.entered.set()
        assert self.release.wait(10)
        if self.fail:
            raise RuntimeError("boom")
        return ids[:, 0].astype(np.float32)

    def submit(self, ids) -> threading.Event:
        answered = threading.Event()
        self.batcher.submit(Job(ids, None, lambda _outcome: answered.set()))
        return answered


@pytest.mark.parametrize("fail", [False, True], ids=["scored", "failed"])
def test_the_batcher_tells_the_clock_when_work_waits_runs_and_completes(fail):
    h = Held()
    h.fail = fail
    far = now_us() + 3600 * S
    assert h.clock.stalled_us(far) == 0
    answered = h.submit([[1], [2]])
    assert h.entered.wait(10)
    st = h.clock.read(far)
    assert (st.queued, st.running) == (0, 1) and st.stalled_us > 3599 * S  # running since about now
    h.release.set()
    assert answered.wait(10)
    h.batcher.stop()
    assert h.clock.read(far) == Stall(0, 0, 0)


def test_a_cancelled_queued_job_leaves_the_clock_idle():
    h = Held()
    first = h.submit([[1]])
    assert h.entered.wait(10)  # the worker is held: the next job stays queued
    answered = threading.Event()
    job = Job([[2]], None, lambda _outcome: answered.set())
    h.batcher.submit(job)
    assert h.clock.read(now_us()).queued == 1
    h.batcher.cancel(job)
    assert answered.is_set() and h.clock.read(now_us()).queued == 0
    h.release.set()
    assert first.wait(10)
    h.batcher.stop()
    assert h.clock.stalled_us(now_us() + 3600 * S) == 0
