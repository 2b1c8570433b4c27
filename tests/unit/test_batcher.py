"""The batching core without a server: a scoring function gated by events, not sleeps."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rmscore.core.batcher import Batcher, Result
from rmscore.core.errors import Code, ScoreError
from rmscore.core.metrics import Metrics
from rmscore.core.planner import PlannerConfig


class GatedModel:
    """Scores a sequence as the sum of its ids; each batch waits for `release` once `gate` is set."""

    def __init__(self, fail_when=None):
        self.batches: list[list[int]] = []  # the lengths of each batch's sequences
        self.entered = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.gated = False
        self.fail_when = fail_when

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.batches.append(mask.sum(1).tolist())
        if self.gated:
            self.entered.release()
            assert self.release.acquire(timeout=30)
        if self.fail_when and self.fail_when(ids, mask):
            raise RuntimeError("boom")
        return (ids * mask).sum(1).astype(np.float32)


class Outcomes:
    def __init__(self):
        self.got: dict[str, object] = {}
        self.calls: dict[str, int] = {}
        self.done = threading.Condition()

    def cb(self, key):
        def done(outcome):
            with self.done:
                self.got[key] = outcome
                self.calls[key] = self.calls.get(key, 0) + 1
                self.done.notify_all()
        return done

    def wait(self, *keys, timeout=30):
        with self.done:
            assert self.done.wait_for(lambda: all(k in self.got for k in keys), timeout), (keys, self.got)
        return [self.got[k] for k in keys]


def make(model, size=4, tokens=10_000, delay_us=0, mode="length_aware", queue=100):
    return Batcher(PlannerConfig(size, tokens, delay_us, mode), queue, model, 0, Metrics("test", "test"))


def test_request_answered_in_order_and_split_over_batches():
    model, out = GatedModel(), Outcomes()
    b = make(model, size=2)
    seqs = [[1, 2, 3], [5], [7, 7], [1] * 10, [2]]
    b.submit(seqs, None, out.cb("a"))
    (r,) = out.wait("a")
    assert isinstance(r, Result) and r.scores == [6, 5, 14, 10, 2]
    assert sum(len(x) for x in model.batches) == 5 and max(len(x) for x in model.batches) <= 2
    assert r.inference_ms > 0 and r.total_ms >= r.inference_ms
    b.stop()


def test_next_batch_joins_sequences_of_many_requests_while_the_model_runs():
    model, out = GatedModel(), Outcomes()
    model.gated = True
    b = make(model, size=8)
    b.submit([[1]], None, out.cb("first"))
    assert model.entered.acquire(timeout=10)  # batch 1 is running; the rest queue behind it
    for k in range(3):
        b.submit([[k + 1] * 4, [k + 1] * 5], None, out.cb(f"r{k}"))
    model.release.release()
    assert model.entered.acquire(timeout=10)
    model.release.release()
    out.wait("first", "r0", "r1", "r2")
    assert model.batches[1] == [4, 5, 4, 5, 4, 5]  # one batch, three requests
    b.stop()


def test_full_queue_is_refused_at_once():
    model, out = GatedModel(), Outcomes()
    model.gated = True
    b = make(model, queue=5)
    b.submit([[1]], None, out.cb("running"))
    assert model.entered.acquire(timeout=10)
    b.submit([[1]] * 5, None, out.cb("queued"))
    with pytest.raises(ScoreError) as e:
        b.submit([[1]], None, out.cb("refused"))
    assert e.value.code == Code.RESOURCE_EXHAUSTED and "5 sequences waiting + 1 requested" in e.value.message
    model.release.release()
    model.gated = False
    out.wait("running", "queued")
    assert "refused" not in out.got
    b.stop()


def test_failing_batch_fails_its_requests_and_the_batcher_keeps_serving():
    model, out = GatedModel(fail_when=lambda ids, mask: (ids == 666).any()), Outcomes()
    b = make(model, size=1)
    b.submit([[666]], None, out.cb("bad"))
    (err,) = out.wait("bad")
    assert isinstance(err, ScoreError) and err.code == Code.INTERNAL and "batch failed: boom" in err.message
    b.submit([[2, 2]], None, out.cb("good"))
    assert out.wait("good")[0].scores == [4]
    assert out.calls == {"bad": 1, "good": 1}
    b.stop()


def test_expired_and_cancelled_sequences_never_reach_the_model():
    import time

    model, out = GatedModel(), Outcomes()
    model.gated = True
    b = make(model, size=8)
    b.submit([[1]], None, out.cb("running"))
    assert model.entered.acquire(timeout=10)
    b.submit([[9] * 3], time.monotonic() - 1, out.cb("expired"))  # deadline already passed
    gone = b.submit([[8] * 3], None, out.cb("cancelled"))
    b.submit([[2] * 7], None, out.cb("kept"))
    b.cancel(gone)
    model.gated = False
    model.release.release()
    expired, cancelled, kept = out.wait("expired", "cancelled", "kept")
    assert expired.code == Code.DEADLINE_EXCEEDED and cancelled.code == Code.CANCELLED
    assert kept.scores == [14]
    assert all(3 not in batch for batch in model.batches)  # neither 3-token sequence was run
    b.stop()


def test_drain_finishes_accepted_work_and_refuses_new():
    model, out = GatedModel(), Outcomes()
    model.gated = True
    b = make(model, size=2)
    b.submit([[1], [2], [3]], None, out.cb("accepted"))
    assert model.entered.acquire(timeout=10)
    b.begin_drain()
    with pytest.raises(ScoreError) as e:
        b.submit([[1]], None, out.cb("late"))
    assert e.value.code == Code.UNAVAILABLE and "draining" in e.value.message
    assert not b.wait_idle(0.05)
    model.gated = False
    model.release.release()
    assert b.wait_idle(10)
    assert out.wait("accepted")[0].scores == [1, 2, 3]
    b.stop()


def test_stop_answers_whatever_is_still_queued():
    model, out = GatedModel(), Outcomes()
    model.gated = True
    b = make(model, size=1)
    b.submit([[1]], None, out.cb("running"))
    assert model.entered.acquire(timeout=10)
    b.submit([[5]], None, out.cb("queued"))
    threading.Timer(0.2, model.release.release).start()
    b.stop()
    (queued,) = out.wait("queued")
    assert isinstance(queued, ScoreError) and queued.code == Code.UNAVAILABLE
    assert out.calls["queued"] == 1


def test_stop_answers_a_batch_built_but_never_run():
    # While the worker runs, a full batch is built ahead into the slot; on stop the worker exits
    # without taking it, so stop itself must answer it (it once left such a call open forever).
    model, out = GatedModel(), Outcomes()
    model.gated = True
    b = make(model, size=1)
    b.submit([[1]], None, out.cb("running"))
    assert model.entered.acquire(timeout=10)
    b.submit([[5]], None, out.cb("built"))
    b.submit([[6]], None, out.cb("queued"))  # a neighbour that does not fit makes [[5]] a full batch
    with b._lock:  # white-box: wait for the batcher to have sealed it, not for time to pass
        assert b._wake.wait_for(lambda: b._slot is not None, 10)
    # Release the running batch only once stop() has marked the batcher stopping, so the worker
    # cannot take the built batch first (as a timer racing stop() could let it).
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    with b._lock:
        assert b._wake.wait_for(lambda: b._stopping, 10)
    model.release.release()
    stopper.join(30)
    built, queued, running = out.wait("built", "queued", "running")
    for e in (built, queued):
        assert isinstance(e, ScoreError) and (e.code, e.message) == (Code.UNAVAILABLE, "not ready: draining")
    assert isinstance(running, Result) and running.scores == [1]
    assert model.batches == [[1]]
