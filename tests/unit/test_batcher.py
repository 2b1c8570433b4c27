"""The batcher end to end with a deterministic stand-in model (score = first id * 1000 + real length,
read back from the padded tensors), so the tests see exactly which sequences went into which batch.
Events are ordered by a gate the model waits at, never by sleeping. Each case has a namesake in
server_cpp/tests/test_batcher.cc (the C++ batcher), and the other way round."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rmscore.core.batcher import Batcher, Job, Result
from rmscore.core.errors import Code, ScoreError
from rmscore.core.metrics import Metrics
from rmscore.core.cost import CostModel, CostTable
from rmscore.core.planner import COST_AWARE, FIFO, LENGTH_AWARE, PlannerConfig
from references import released

LABELS = {"server": "test", "backend": "v0", "device": "cpu"}


class Gate:
    """Holds model runs: each run entering waits for one release (or for open). Counts the entries."""

    def __init__(self):
        self._cv = threading.Condition()
        self._entered = self._released = 0
        self._open = False

    def enter(self) -> None:
        with self._cv:
            self._entered += 1
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._open or self._released > 0)
            if not self._open:
                self._released -= 1

    def wait_entered(self, n: int) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._entered >= n, 10)

    def release(self) -> None:
        with self._cv:
            self._released += 1
            self._cv.notify_all()

    def open(self) -> None:
        with self._cv:
            self._open = True
            self._cv.notify_all()


class Harness:
    """The stand-in model and a FIFO batcher around it."""

    def __init__(self, max_batch_size: int, delay_us: int = 0, max_queue: int = 4096, mode: str = FIFO,
                 cost: CostTable | None = None, workers: int = 1, max_wait_us: int = 0, seed: float = 0.0,
                 lone: bool = False, lone_hold_us: int = 1_000_000, on_idle=None, idle_release_us: int = 0,
                 on_refined=None, refine_on_thread_cpu: bool = False):
        self.metrics = Metrics("test", "v0")
        self.gate = Gate()
        self.gated = False  # set before the first submit
        self.fail_on = None  # a batch holding a sequence with this first id fails "boom"
        self.aborted = False
        self.sleep_s = 0.0  # each run sleeps this long: wall time without CPU, as a preempted run
        self.batches: list[list[int]] = []  # the first id of each sequence of each batch the model saw
        self.lone_batches: list[list[int]] = []  # those of them that ran on the lone model
        opts = Batcher.Options(PlannerConfig(max_batch_size, 1 << 20, delay_us, mode), max_queue, 0,
                               CostModel(cost) if cost is not None else None, max_wait_us, seed,
                               lone_hold_us=lone_hold_us, on_idle=on_idle, idle_release_us=idle_release_us,
                               on_refined=on_refined, refine_on_thread_cpu=refine_on_thread_cpu)
        self.batcher = Batcher(opts, [self.model] * workers, self.metrics, self.abort,
                               lone=self.lone_model if lone else None)

    def lone_model(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.lone_batches.append(ids[:, 0].tolist())
        return self.model(ids, mask)

    def abort(self) -> None:
        self.aborted = True
        self.gate.open()

    def model(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        firsts = ids[:, 0].tolist()
        self.batches.append(firsts)
        if self.gated:
            self.gate.enter()
        if self.aborted:
            raise RuntimeError("terminated")
        if self.fail_on in firsts:
            raise RuntimeError("boom")
        time.sleep(self.sleep_s)
        return (ids[:, 0] * 1000 + mask.sum(1)).astype(np.float32)

    def read(self, name: str, label: str | None = None) -> float:
        """One series' value as a scrape would read it (a histogram: its count)."""
        labels = dict(LABELS, reason=label) if label else LABELS
        value = self.metrics.registry.get_sample_value(name, labels)
        if value is None:
            value = self.metrics.registry.get_sample_value(name + "_count", labels)
        return -1 if value is None else value


class Submitted:
    """A job, its one answer once it comes, and how many answers it got."""

    def __init__(self, ids: list[list[int]], deadline_s: float | None = None):
        self.ids = ids
        self.calls = 0
        self.outcome: Result | ScoreError | None = None
        self._cv = threading.Condition()
        self.job = Job(ids, deadline_s, self._done)
        self.admitted: ScoreError | None = None

    def _done(self, outcome) -> None:
        with self._cv:
            self.calls += 1
            self.outcome = outcome
            self._cv.notify_all()

    def get(self):
        with self._cv:
            assert self._cv.wait_for(lambda: self.calls > 0, 10), self.ids
        return self.outcome


def submit(b: Batcher, ids: list[list[int]], deadline_s: float | None = None) -> Submitted:
    s = Submitted(ids, deadline_s)
    try:
        b.submit(s.job)
    except ScoreError as e:
        s.admitted = e
    return s


def code_of(outcome) -> Code:
    assert isinstance(outcome, ScoreError), outcome
    return outcome.code


def test_splits_requests_over_batches_and_answers_in_request_order():
    h = Harness(max_batch_size=2)
    a = submit(h.batcher, [[1, 1, 1], [2], [3, 3], [4, 4, 4, 4], [5]])
    b = submit(h.batcher, [[6, 6]])
    assert a.admitted is None
    ra, rb = a.get(), b.get()
    assert isinstance(ra, Result) and ra.scores == [1003, 2001, 3002, 4004, 5001]
    assert rb.scores == [6002]
    assert ra.inference_ms > 0 and ra.total_ms >= ra.inference_ms
    assert all(len(batch) <= 2 for batch in h.batches) and sum(map(len, h.batches)) == 6
    h.batcher.stop()
    assert (a.calls, b.calls) == (1, 1)


def test_joins_sequences_of_several_requests_into_one_batch():
    # A one-minute delay: only a full batch runs. Four sequences of three requests fill it; a fifth
    # that does not fit is what makes it full, and waits.
    h = Harness(max_batch_size=4, delay_us=60_000_000)
    a = submit(h.batcher, [[1]])
    b = submit(h.batcher, [[2], [2, 2]])
    c = submit(h.batcher, [[3]])
    d = submit(h.batcher, [[4]])
    assert a.get().scores == [1001]
    assert b.get().scores == [2001, 2002]
    assert c.get().scores == [3001]
    assert h.batches == [[1, 2, 2, 3]]
    h.batcher.stop()
    assert code_of(d.get()) == Code.UNAVAILABLE


def test_arrivals_during_a_run_join_the_next_batch():
    # Zero delay: an idle batcher runs whatever waits. While the model holds the first batch,
    # three requests arrive; they wait together and run as one batch after it.
    h = Harness(max_batch_size=8)
    h.gated = True
    first = submit(h.batcher, [[1]])
    assert h.gate.wait_entered(1)
    a = submit(h.batcher, [[2]])
    b = submit(h.batcher, [[3], [3, 3]])
    c = submit(h.batcher, [[4]])
    h.gate.open()
    assert first.get().scores == [1001]
    assert a.get().scores == [2001]
    assert b.get().scores == [3001, 3002]
    assert c.get().scores == [4001]
    assert h.batches == [[1], [2, 3, 3, 4]]
    h.batcher.stop()


def test_a_failing_batch_fails_its_requests_and_serving_goes_on():
    h = Harness(max_batch_size=1)
    h.fail_on = 66
    bad = submit(h.batcher, [[1], [66], [2], [3]])
    r = bad.get()
    assert code_of(r) == Code.INTERNAL and r.message == "batch failed: boom"
    good = submit(h.batcher, [[7]])
    assert good.get().scores == [7001]
    # The failed request's sequences still queued never reached the model.
    assert h.batches == [[1], [66], [7]]
    h.batcher.stop()
    assert bad.calls == 1


def test_a_failed_batch_counts_in_the_batch_metrics_not_in_scored():
    h = Harness(max_batch_size=2)
    h.fail_on = 66
    assert code_of(submit(h.batcher, [[66]]).get()) == Code.INTERNAL
    assert isinstance(submit(h.batcher, [[1], [2]]).get(), Result)
    assert h.read("rmscore_batch_size") == 2
    assert h.read("rmscore_batch_inference_seconds") == 2
    assert h.read("rmscore_batch_padding_ratio") == 2
    assert h.read("rmscore_sequences_scored_total") == 2  # only the batch that succeeded
    assert h.read("rmscore_queue_wait_seconds") == 3  # every sequence taken into a batch
    h.batcher.stop()


def test_queue_full_is_refused_at_once_with_the_contract_message():
    h = Harness(max_batch_size=64, delay_us=60_000_000, max_queue=3)
    a = submit(h.batcher, [[1], [2]])
    assert a.admitted is None
    b = submit(h.batcher, [[3], [4]])
    assert b.admitted.code == Code.RESOURCE_EXHAUSTED
    assert b.admitted.message == "queue full: 2 sequences waiting + 2 requested exceed max_queue_sequences 3"
    h.batcher.cancel(b.job)  # a refused job is never answered, even when its caller then cancels
    h.batcher.stop()  # the waiting one fails once
    assert code_of(a.get()) == Code.UNAVAILABLE
    assert b.calls == 0


def test_queued_work_past_the_bound_or_the_deadline_is_refused_at_once():
    # A seeded rate (100 us per token) and the model held at the gate: the work queued is known exactly.
    h = Harness(max_batch_size=1, max_wait_us=1_000_000, seed=100.0)
    h.gated = True
    running = submit(h.batcher, [[1] * 10])
    assert h.gate.wait_entered(1)  # in the model: 1 ms of work until it ends
    queued = submit(h.batcher, [[2] * 5000])  # 0.501 s of model work ahead of whoever comes next
    assert h.read("rmscore_queue_expected_wait_seconds") == 0.501
    late = submit(h.batcher, [[3]], time.monotonic() + 0.2)
    assert late.admitted.code == Code.DEADLINE_EXCEEDED
    assert late.admitted.message.startswith("deadline exceeded before scoring: about 501 ms of model work waiting and up to 0 ms for its own batch, ")
    # What front ends ask before reading a request: the same refusals, without its size.
    assert h.batcher.work_refusal(time.monotonic() + 30) is None
    assert h.batcher.work_refusal(time.monotonic() + 0.2).code == Code.DEADLINE_EXCEEDED
    fine = submit(h.batcher, [[4]], time.monotonic() + 30)
    more = submit(h.batcher, [[5] * 6000])  # 0.5011 s ahead of it: within the bound
    assert (fine.admitted, more.admitted) == (None, None)
    over = submit(h.batcher, [[6]])  # 1.1011 s ahead of it
    assert over.admitted.code == Code.RESOURCE_EXHAUSTED
    assert over.admitted.message == "queue full: about 1101 ms of model work waiting exceeds max_queue_wait_seconds (1000 ms)"
    assert h.batcher.work_refusal(None).message == over.admitted.message
    h.gate.open()
    assert [s.get().scores for s in (running, queued, fine, more)] == [[1010], [7000], [4001], [11000]]
    assert (late.calls, over.calls) == (0, 0)
    assert h.read("rmscore_queue_expected_wait_seconds") == 0  # the queue is empty again
    h.batcher.stop()


def test_a_short_deadline_is_batched_only_with_what_ends_before_it():
    # Seeded at 1000 us per token: a 4-token request due in 2 s, then fifteen 512-token ones. Without the
    # cap it rode in one batch of 16 x 512 (8.2 s by the rate) and waited out its deadline inside it.
    h = Harness(max_batch_size=16, delay_us=60_000_000, mode=LENGTH_AWARE, seed=1000.0)
    probe = submit(h.batcher, [[1] * 4], time.monotonic() + 2.0)
    flood = submit(h.batcher, [[2] * 512] * 15)
    assert (probe.admitted, flood.admitted) == (None, None)
    assert probe.get().scores == [1004]  # scored in time
    assert h.batches[0] == [1, 2, 2]  # 3 x 512 x 1 ms = 1.5 s fits before the deadline; a fourth would not
    h.batcher.stop()


def test_expired_sequences_never_reach_the_model():
    h = Harness(max_batch_size=8)
    late = submit(h.batcher, [[1], [2]], time.monotonic() - 0.001)
    r = late.get()
    assert code_of(r) == Code.DEADLINE_EXCEEDED and r.message == "deadline exceeded before scoring"
    assert h.batches == []
    assert h.read("rmscore_sequences_dropped_total", "deadline") == 2
    h.batcher.stop()


class Ids(list):
    """A sequence a test can hold a weak reference to."""


def test_an_idle_batcher_holds_nothing_of_the_jobs_it_answered():
    # Its thread kept the last batch, and through it each job and every sequence of the request,
    # while it waited for the next: 4 abandoned 1024-pair requests kept +34 MiB of token ids on an idle
    # py-http server. Neither an answered job nor a failed one may pin its sequences; the batcher
    # holds no job once it is answered.
    import weakref

    h = Harness(max_batch_size=2)
    ok = Submitted([Ids([1, 1]), Ids([2])])
    h.batcher.submit(ok.job)
    assert ok.get().scores == [1002, 2001]
    h.fail_on = 7
    bad = Submitted([Ids([7]), Ids([8, 8]), Ids([9])])
    h.batcher.submit(bad.job)
    assert code_of(bad.get()) == Code.INTERNAL
    seqs = [weakref.ref(x) for s in (ok, bad) for x in s.ids]
    jobs = [weakref.ref(s.job) for s in (ok, bad)]
    ok.ids = bad.ids = None
    assert all(released(r) for r in seqs), "an answered job still holds its sequences"
    ok.job = bad.job = None
    assert all(released(r) for r in jobs), "the idle batcher still holds an answered job"
    h.batcher.stop()


def test_cancelled_sequences_are_dropped_before_the_model():
    h = Harness(max_batch_size=8, delay_us=60_000_000)
    s = submit(h.batcher, [[1], [2]])
    h.batcher.cancel(s.job)
    r = s.get()
    assert code_of(r) == Code.CANCELLED and r.message == "cancelled by the client"
    assert h.batches == []
    assert h.read("rmscore_sequences_dropped_total", "cancelled") == 2
    h.batcher.stop()


def test_cancel_while_in_the_model_answers_at_once_and_drops_the_rest():
    h = Harness(max_batch_size=1)
    h.gated = True
    s = submit(h.batcher, [[1], [2], [3]])
    assert h.gate.wait_entered(1)
    h.batcher.cancel(s.job)  # answered now, with its first sequence still in the model
    assert code_of(s.get()) == Code.CANCELLED
    h.gate.open()
    assert isinstance(submit(h.batcher, [[4]]).get(), Result)
    assert h.batches == [[1], [4]]
    assert h.read("rmscore_sequences_dropped_total", "cancelled") == 2
    h.batcher.stop()
    assert s.calls == 1


def test_cancel_before_submit_refuses_the_job():
    # A stream item can be cancelled between its front end registering it and submitting it.
    h = Harness(max_batch_size=8)
    s = Submitted([[1]])
    h.batcher.cancel(s.job)
    with pytest.raises(ScoreError) as e:
        h.batcher.submit(s.job)
    assert (e.value.code, e.value.message) == (Code.CANCELLED, "cancelled by the client")
    assert h.batcher.drain(time.monotonic() + 10)  # nothing was accepted
    assert s.calls == 0
    h.batcher.stop()


def test_drain_finishes_accepted_work_then_refuses():
    h = Harness(max_batch_size=2)
    h.gated = True
    a = submit(h.batcher, [[1], [2], [3]])
    assert h.gate.wait_entered(1)
    assert not h.batcher.drain(time.monotonic() + 0.05)  # a batch is held in the model
    late = submit(h.batcher, [[4]])
    assert (late.admitted.code, late.admitted.message) == (Code.UNAVAILABLE, "not ready: draining")
    h.gate.open()
    assert h.batcher.drain(time.monotonic() + 10)
    assert a.calls == 1  # answered before drain returned
    assert a.outcome.scores == [1001, 2001, 3001]
    assert late.calls == 0
    h.batcher.stop()


def test_stop_aborts_the_running_batch_and_fails_the_rest_once():
    h = Harness(max_batch_size=1)
    h.gated = True  # a model run that only ends when released or aborted
    running = submit(h.batcher, [[1]])
    assert h.gate.wait_entered(1)
    queued = submit(h.batcher, [[2], [3]])
    h.batcher.stop()
    r = running.get()
    # The aborted run is the drain's refusal, not a model fault: UNAVAILABLE, never INTERNAL.
    assert code_of(r) == Code.UNAVAILABLE and r.message == "not ready: draining"
    q = queued.get()
    assert code_of(q) == Code.UNAVAILABLE and q.message == "not ready: draining"
    assert (running.calls, queued.calls) == (1, 1)
    assert h.batches == [[1]]


def test_stop_without_abort_lets_the_running_batch_finish():
    # The Python servers' backends cannot abort a run: stop fails the queue, then waits for it.
    gate = Gate()

    def model(ids, mask):
        gate.enter()
        return np.full(len(ids), 0.5, dtype=np.float32)

    batcher = Batcher(Batcher.Options(PlannerConfig(1, 1 << 20, 0, FIFO)), model, Metrics("test", "v0"))
    running = submit(batcher, [[1]])
    assert gate.wait_entered(1)
    queued = submit(batcher, [[2]])
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    assert code_of(queued.get()) == Code.UNAVAILABLE  # failed before the join
    gate.release()
    stopper.join(10)
    r = running.get()
    assert isinstance(r, Result) and r.scores == [0.5]


def test_many_concurrent_submitters_each_answered_once():
    h = Harness(max_batch_size=5, delay_us=500)
    everything: list[Submitted] = []
    lock = threading.Lock()

    def submitter(t: int) -> None:
        for i in range(50):
            s = submit(h.batcher, [[t + 1, i], [i + 1]])
            with lock:
                everything.append(s)

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for s in everything:
        r = s.get()
        assert isinstance(r, Result), r
        assert r.scores == [s.ids[0][0] * 1000 + 2, s.ids[1][0] * 1000 + 1]
    h.batcher.stop()
    assert all(s.calls == 1 for s in everything)


# The shared vectors' tables (contract/make_batching_vectors.py), in milliseconds rather than
# microseconds: batch 1 wins on the CPU-like one, the biggest batch on the GPU-like one. At this scale
# the refinement from a run the gate held for a few ms cannot tip the choice (the server's C++ twin
# once ran {1},{2,3},{4,5} with microsecond tables).
_SIZES, _LENGTHS = [1, 2, 4, 8], [16, 128]
CPU_LIKE = CostTable.make(_SIZES, _LENGTHS, [[1000 * (300 + 12 * b * n * (4 + b) // 4) for n in _LENGTHS]
                                             for b in _SIZES])
GPU_LIKE = CostTable.make(_SIZES, _LENGTHS, [[1000 * (5000 + 2 * b * n) for n in _LENGTHS] for b in _SIZES])


def test_cost_aware_with_a_cpu_like_table_runs_sequences_one_at_a_time():
    # While the model holds the first batch four requests arrive; where one sequence per run is
    # cheapest per sequence, they run one by one rather than as the one batch fifo would make.
    h = Harness(max_batch_size=8, mode=COST_AWARE, cost=CPU_LIKE)
    h.gated = True
    first = submit(h.batcher, [[1] * 100])
    assert h.gate.wait_entered(1)
    rest = [submit(h.batcher, [[k] * 100]) for k in (2, 3, 4, 5)]
    h.gate.open()
    assert [r.get().scores for r in [first, *rest]] == [[k * 1000 + 100] for k in (1, 2, 3, 4, 5)]
    assert h.batches == [[1], [2], [3], [4], [5]]
    h.batcher.stop()


def test_cost_aware_with_a_gpu_like_table_waits_to_fill_the_batch():
    # A one-minute delay: three sequences wait for a fourth, since four at once cost little more
    # than one; the fourth makes the best batch and it runs at once.
    h = Harness(max_batch_size=4, delay_us=60_000_000, mode=COST_AWARE, cost=GPU_LIKE)
    jobs = [submit(h.batcher, [[k] * 100]) for k in (1, 2, 3)]
    jobs.append(submit(h.batcher, [[4] * 100]))
    assert [j.get().scores for j in jobs] == [[k * 1000 + 100] for k in (1, 2, 3, 4)]
    assert h.batches == [[1, 2, 3, 4]]
    h.batcher.stop()


def test_cost_aware_refines_its_table_from_the_batches_it_runs():
    h = Harness(max_batch_size=8, mode=COST_AWARE, cost=CPU_LIKE)
    before = h.batcher._opts.cost.table.batch_us(1, 16)
    for k in range(1, 6):
        assert submit(h.batcher, [[k] * 16]).get().scores == [k * 1000 + 16]
    # The stand-in model takes microseconds, the table said 300+: each run pulled the cell down.
    assert h.batcher._opts.cost.observed == 5
    assert h.batcher._opts.cost.table.batch_us(1, 16) < before
    h.batcher.stop()


@pytest.mark.parametrize("on_thread_cpu", [False, True])
def test_the_table_is_refined_by_the_runs_thread_cpu_where_told(on_thread_cpu):
    # Each run sleeps 30 ms, as a run whose core other processes took: 30 ms of wall clock, next to no
    # CPU. By the wall clock the cell rises toward 30 ms; by the thread's CPU time it falls (the table
    # said 1 ms).
    table = CostTable.make(_SIZES, _LENGTHS, [[1000 * b for _ in _LENGTHS] for b in _SIZES])
    h = Harness(max_batch_size=8, mode=COST_AWARE, cost=table, refine_on_thread_cpu=on_thread_cpu)
    h.sleep_s = 0.03
    before = h.batcher._opts.cost.table.batch_us(1, 16)
    for k in range(1, 4):
        assert submit(h.batcher, [[k] * 16]).get().scores == [k * 1000 + 16]
    h.batcher.stop()
    after = h.batcher._opts.cost.table.batch_us(1, 16)
    assert h.batcher._opts.cost.observed == 3
    assert (after < before) if on_thread_cpu else (after > before + 5_000)


def test_two_model_workers_run_two_batches_at_once():
    h = Harness(max_batch_size=1, workers=2)
    h.gated = True
    a = submit(h.batcher, [[1]])
    b = submit(h.batcher, [[2]])
    assert h.gate.wait_entered(2)  # both in the model together: one worker could never get here
    h.gate.open()
    assert (a.get().scores, b.get().scores) == ([1001], [2001])
    h.batcher.stop()
    assert not h.batcher.running()


def test_a_batch_alone_runs_on_the_lone_model_and_one_beside_it_on_its_worker():
    h = Harness(max_batch_size=1, workers=2, lone=True)
    h.gated = True
    a = submit(h.batcher, [[1]])
    assert h.gate.wait_entered(1)  # alone: every thread
    b = submit(h.batcher, [[2]])
    assert h.gate.wait_entered(2)  # beside it: its worker's session
    c = submit(h.batcher, [[3]])  # waits for a worker
    h.gate.open()
    assert (a.get().scores, b.get().scores, c.get().scores) == ([1001], [2001], [3001])
    # Batches ran at once, so the one left waiting ran on its worker's session. Whether the next one
    # alone does depends on which of them ended last (the lone one, overlapped, holds); a batch that
    # ends alone, showing no other work, gives every thread back to the one after it.
    assert submit(h.batcher, [[4]]).get().scores == [4001]
    assert submit(h.batcher, [[5]]).get().scores == [5001]
    assert h.batches == [[1], [2], [3], [4], [5]]
    assert h.lone_batches in ([[1], [5]], [[1], [4], [5]])
    h.batcher.stop()


def test_work_arriving_while_a_lone_batch_runs_holds_lone_batches():
    # One worker: the second request waits for the lone batch (nothing runs beside it), and still
    # shows a load of more than one request at a time.
    h = Harness(max_batch_size=1, workers=1, lone=True)
    h.gated = True
    a = submit(h.batcher, [[1]])
    assert h.gate.wait_entered(1)
    b = submit(h.batcher, [[2]])
    h.gate.open()
    assert (a.get().scores, b.get().scores) == ([1001], [2001])
    assert submit(h.batcher, [[3]]).get().scores == [3001]  # [2] ended alone: every thread again
    assert h.lone_batches == [[1], [3]]  # the one left waiting ran on the worker
    h.batcher.stop()


def _several_after_a_lone_one(h: Harness) -> None:
    """[9] alone (every thread), [1] and [2] queued behind it: one batch of two requests after it."""
    h.gated = True
    blocker = submit(h.batcher, [[9]])
    assert h.gate.wait_entered(1)
    a, b = submit(h.batcher, [[1]]), submit(h.batcher, [[2]])
    h.gate.open()
    assert (blocker.get().scores, a.get().scores, b.get().scores) == ([9001], [1001], [2001])


def test_a_batch_of_several_requests_holds_lone_batches():
    h = Harness(max_batch_size=8, workers=1, lone=True)
    _several_after_a_lone_one(h)
    assert submit(h.batcher, [[3]]).get().scores == [3001]  # held: [1, 2] were two requests at once
    assert submit(h.batcher, [[4]]).get().scores == [4001]  # [3] ended alone: every thread again
    assert h.batches == [[9], [1, 2], [3], [4]]
    assert h.lone_batches == [[9], [4]]
    h.batcher.stop()


def test_the_hold_ends_on_its_own_after_lone_hold_us():
    h = Harness(max_batch_size=8, workers=1, lone=True, lone_hold_us=200_000)
    _several_after_a_lone_one(h)
    time.sleep(0.3)  # no batch ended meanwhile
    assert submit(h.batcher, [[3]]).get().scores == [3001]
    assert h.lone_batches == [[9], [3]]
    h.batcher.stop()


def test_a_batch_that_leaves_work_waiting_runs_on_its_worker():
    # Two sequences, batches of one: the first leaves the second waiting for the other worker, so
    # neither takes every thread.
    h = Harness(max_batch_size=1, workers=2, lone=True)
    h.gated = True
    a = submit(h.batcher, [[1], [2]])
    assert h.gate.wait_entered(2)
    h.gate.open()
    assert a.get().scores == [1001, 2001]
    assert sorted(h.batches) == [[1], [2]]
    assert h.lone_batches == []
    h.batcher.stop()


def test_lone_runs_do_not_refine_the_cost_table():
    # The table describes the workers' sessions, where batches run under load.
    h = Harness(max_batch_size=8, mode=COST_AWARE, cost=CPU_LIKE, workers=2, lone=True)
    for k in range(1, 4):
        assert submit(h.batcher, [[k] * 16]).get().scores == [k * 1000 + 16]
    assert h.lone_batches == [[1], [2], [3]]
    assert h.batcher._opts.cost.observed == 0
    h.batcher.stop()



def test_on_idle_runs_once_when_a_burst_ends_not_between_its_batches():
    # The runtime gives back memory grown for large batches when the batcher goes idle (runtimes/ort.py):
    # not while work waits, where the next batch would grow it again (shrinking every batch costs ~4%).
    seen: list[int] = []
    h = Harness(max_batch_size=1, on_idle=lambda: seen.append(len(h.batches)))
    h.gated = True
    jobs = [submit(h.batcher, [[i] * 4]) for i in (1, 2, 3)]
    assert h.gate.wait_entered(1)
    h.gate.open()
    for j in jobs:
        j.get()
    assert _first_call(seen) == [3]
    h.batcher.stop()


def test_on_idle_waits_for_a_quiet_spell_and_work_within_it_defers_it():
    # A closed-loop client sends its next request as soon as it is answered: releasing at once would
    # shrink between every two of its batches. Work that starts within idle_release_us defers it.
    seen: list[int] = []
    h = Harness(max_batch_size=1, on_idle=lambda: seen.append(len(h.batches)), idle_release_us=400_000)
    for i in (1, 2, 3):
        submit(h.batcher, [[i] * 4]).get()
        time.sleep(0.05)
    assert seen == []
    assert _first_call(seen) == [3]
    h.batcher.stop()


def test_a_failing_on_idle_leaves_serving_as_it_was():
    def fail():
        raise RuntimeError("no")

    h = Harness(max_batch_size=4, on_idle=fail)
    assert submit(h.batcher, [[1] * 4]).get().scores == [1004]
    assert submit(h.batcher, [[2] * 4]).get().scores == [2004]
    h.batcher.stop()


def test_on_refined_hands_over_the_refined_table_once_per_quiet_spell_after_batches():
    # The server keeps the table the batches refined for its next start (core/cost_profile.py): told at
    # the quiet spell after a burst, with how many batches refined it; not again until more ran.
    seen: list[tuple] = []
    # Costs far above the stand-in's runs (microseconds), so refining changes the table whatever the
    # machine's load: at 100 us a cell, runs near 100 us left the refined table equal to this one.
    cost = CostTable.make([1, 2], [4, 8], [[100_000, 200_000], [150_000, 300_000]])
    h = Harness(max_batch_size=1, mode=COST_AWARE, cost=cost, on_refined=lambda t, n: seen.append((t, n)),
                idle_release_us=300_000)
    for i in (1, 2, 3):
        submit(h.batcher, [[i] * 4]).get()
    assert _first_call(seen) == [(h.batcher._opts.cost.table, 3)] and seen[0][0] != cost
    time.sleep(0.1)
    assert len(seen) == 1
    submit(h.batcher, [[4] * 4]).get()
    assert len(_first_call(seen, 2)) == 2 and seen[1][1] == 1
    h.batcher.stop()


def test_stop_hands_over_what_batches_refined_since_the_last_quiet_spell():
    # A server loaded until it stops is never idle for a second: stop keeps the refined table then.
    seen: list[tuple] = []
    h = Harness(max_batch_size=1, mode=COST_AWARE, cost=CostTable.make([1, 2], [4, 8], [[100, 200], [150, 300]]),
                on_refined=lambda t, n: seen.append((t, n)), idle_release_us=60_000_000)
    for i in (1, 2):
        submit(h.batcher, [[i] * 4]).get()
    assert seen == []
    h.batcher.stop()
    assert seen == [(h.batcher._opts.cost.table, 2)]
    h.batcher.stop()  # a second stop has nothing new to tell
    assert len(seen) == 1


def test_a_failing_on_refined_leaves_serving_as_it_was():
    def fail(t, n):
        raise OSError("read-only")

    h = Harness(max_batch_size=1, mode=COST_AWARE, cost=CostTable.make([1], [4], [[100]]), on_refined=fail)
    assert submit(h.batcher, [[1] * 4]).get().scores == [1004]
    time.sleep(0.05)
    assert submit(h.batcher, [[2] * 4]).get().scores == [2004]
    h.batcher.stop()


def _first_call(seen: list, n: int = 1) -> list:
    """`seen` once it holds `n` calls (waits up to 5 s)."""
    deadline = time.monotonic() + 5
    while len(seen) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return seen
