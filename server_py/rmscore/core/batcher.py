"""Dynamic batching, Triton-style, shared by the Python gRPC and HTTP servers.

The sequences of accepted requests wait in one queue; a batcher thread asks the
planner (planner.py) what to run or how long to wait, then runs that batch on the
model itself, and each request is answered once all of its sequences are scored,
or at once when it fails. With several model workers (--model-workers) there is
one batcher thread per worker, all running the same loop: whichever is idle plans
the next batch. With a `lone` model (--model-workers elastic, the default) a batch
that starts while no other runs and none waits runs on it instead: a session with
every intra-op thread, so a batch alone gets them all and batches at once get one
each (runtimes/workers.py). server_cpp/src/batcher.{h,cc} is this file in C++, with
the same names and the same steps (docs/batching.md, "Structure").

Fair order (issue 29, defect 4): the queue is ordered by callers' turns, not by arrival. Each
sequence's turn starts where its caller's previous one ended (the caller's own work so far, in real
tokens), or at the head when that is later, and ends its length later. The sequence ranks by where
its turn ends (its virtual finish, as in weighted fair queueing; ties by arrival): a caller whose work
has all been taken starts at the head, and its sequence runs before every sequence that ends later.
Ranking by the start instead (start-time fair queueing, until 2026-12-06) put a 16-token probe behind
every 512-token first item tied with it at the head: 80 connections each streaming one were seconds of
work ahead of it (docs/bench/attacks_2026-12-06.md).
The head is the queue's virtual time, which follows fair queueing's (GPS): when a batch starts, the
head is at least where the turn of its first sequence (its lowest rank) started; when the batch
ends, the head moves on by the batch's real tokens over the callers sharing the model then (at least
one token, at most to the end of that first turn), as GPS's virtual time moves by the work served
over the callers it serves. The callers sharing are GPS's backlogged ones: those whose turns end
past the head, whether or not their next request has come yet. So serving turns moves the head, and
new callers pass a long sequence for a bounded time (a server kept full by one 10-token newcomer per
batch ran a 100-token sequence after 44 of them: tests/unit/test_caller_turns.py).
Until the afternoon of 2026-12-06 the head was the latest start taken, or the earliest start queued:
a long sequence held it at its start, every new caller started there too (each connection a client
opens per request is one), and shorter sequences ranked before the long one for as long as they
came. Tried on the way, measured with 32 connections each keeping one 512-token request going and a
probe every 0.25 s (tests/conformance/test_fair_share.py, 24 probes): the head at the end of the turn
taken (self-clocked fair queueing) put a new caller behind every turn that ended with it (3 of 24
answered on cpp-grpc); counting only the callers with work queued moved it past turns whose callers
were between requests (8 to 18 of 24 answered); counting the callers when the batch started moved
it past everyone who came while a first caller's batch ran alone (18 of 24 on py-grpc).
The planner builds every batch around the lowest
rank (planner.QueueIndex), so callers with work queued take turns, a token of work each, and a new
caller's first sequence runs in the next batch or two whatever the others hold: a request larger
than the work bound is fed to the model in its caller's turns, behind other callers' sequences.
With one caller the order is arrival order. Admission counts the same turns (`_work_refusal_locked`).
A caller is a connection (admission.CALLER); the front ends set it.

Locking: everything shared lives under `_mu`. It is held to admit, plan, take and
pack a batch, and to mark requests finished; never across the model run or an
answer's callback. Any thread holding it may remove sequences from the queue
(cancel on the event loop, stop on the main thread).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rmscore.core.admission import QueueWork
from rmscore.core.cost import CostModel, CostTable
from rmscore.core.errors import Code, ScoreError
from rmscore.core.liveness import StallClock
from rmscore.core.metrics import Metrics
from rmscore.core.planner import ArrivalRate, PlannerConfig, QueueIndex, Waiting, plan_live
from rmscore.model.padding import pad_batch


@dataclass
class Result:
    """A request's scores, in request order (a failure is a ScoreError instead)."""

    scores: list[float]
    total_ms: float
    inference_ms: float

    @property
    def queue_ms(self) -> float:
        return max(0.0, self.total_ms - self.inference_ms)


Done = Callable[["Result | ScoreError"], None]
# Scores one padded batch (input_ids, attention_mask) or raises; the batcher thread calls it.
BatchModel = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _draining() -> ScoreError:
    return ScoreError(Code.UNAVAILABLE, "not ready: draining")


class Job:
    """One accepted unit of work: a Score call or one ScoreStream item.

    `deadline_s` is a time.monotonic() value or None; `done` runs exactly once, never
    under the batcher's lock, and must not block.
    """

    def __init__(self, seqs: list[list[int]], deadline_s: float | None, done: Done, caller: str = ""):
        # Emptied once the job is finished and none of its sequences is queued: whoever still holds a
        # finished job (a frontend's callback, a batch's bookkeeping) no longer holds its tokens.
        self.seqs = seqs
        self.deadline_s = deadline_s
        self.done = done
        self.caller = caller  # whose turns its sequences take (admission.CALLER)
        # Guarded by Batcher._mu; set by submit.
        self.accepted = False
        self.accepted_at = 0.0
        self.deadline_us: int | None = None  # on the batcher's clock (_now_us: monotonic)
        self.first_seq_id = 0  # its sequences have ids first_seq_id .. + len(seqs) - 1
        # Guarded by Batcher._mu until finished; final (read without the lock) after.
        self.scores = np.zeros(len(seqs), dtype=np.float32)
        self.remaining = len(seqs)  # sequences not scored yet
        self.error: ScoreError | None = None  # why it failed, when it did
        self.finished = False  # answered, refused, or cancelled before submit
        self.inference_ms = 0.0


@dataclass
class _Queued:
    job: Job
    index: int  # position in the job's sequences
    arrival_us: int


@dataclass
class _Batch:
    seqs: list[_Queued]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    padding_ratio: float
    real_tokens: int
    started_us: int = 0  # when it was counted running (_now_us)
    first_end: int = 0  # where its first sequence's turn ends: the head moves no further when it ends


def _now_us() -> int:
    return time.monotonic_ns() // 1000


class Batcher:
    @dataclass(frozen=True)
    class Options:
        planner: PlannerConfig
        max_queue_sequences: int = 4096
        pad_token_id: int = 0
        # What batches cost here (cost_aware plans with it; every run refines it). Guarded by _mu.
        cost: CostModel | None = None
        # Admission by work (admission.py): refuse when the queued work exceeds this (0: no bound) or
        # the caller's deadline; the rate starts at the seed (model us per real token, 0: unknown).
        max_queue_wait_us: int = 0
        seed_us_per_token: float = 0.0
        # Told when work waits and when batches start and end (core/liveness.py): liveness reads it
        # without _mu, so it answers while a batcher thread is stuck. None: not tracked.
        progress: StallClock | None = None
        # After a batch that showed more than one caller's work (another batch running or started beside
        # it, work waiting when it ended, or several requests in it), batches run on the workers'
        # sessions until one ends showing none, or for this long (docs/batching.md, "Threads"). C++'s
        # Options::lone_hold_us.
        lone_hold_us: int = 1_000_000
        # Called (without _mu, on a batcher thread) once the batcher has been idle, nothing queued or
        # running, for idle_release_us since a batch ended: the runtime may give back memory grown for
        # large batches (runtimes/ort.py). Not at once: a closed-loop client's next request often comes
        # within milliseconds, and its batch would grow the memory again (~4% a batch). Its failure is
        # ignored: serving goes on with the memory kept. C++'s Options::on_idle.
        on_idle: Callable[[], None] | None = None
        idle_release_us: int = 1_000_000
        # Called (without _mu, on a batcher thread) at the same moment as on_idle, and once more by stop
        # (on its caller's thread), when batches refined the cost table since the last call: the table
        # and how many batches refined it since. The server keeps it for its next start
        # (core/cost_profile.py, the cache). Its failure is ignored. C++'s Options::on_refined.
        on_refined: Callable[[CostTable, int], None] | None = None
        # Refine the cost table with the CPU time the run took on its batcher thread, not the wall
        # clock: right where a run works on its caller's thread alone (a 1-thread session on a CPU, the
        # workers of --model-workers elastic), where the wall clock counts the time other processes
        # took the core (a 1-thread run of 128 tokens: 28 ms alone, 62 ms wall and 30 ms of its
        # thread's CPU beside three busy processes), and those inflated cells, never chosen again, were
        # never corrected (docs/batching.md, "Timed by the run's thread, not the wall clock").
        # Admission's rate keeps the wall clock: waits are wall time. C++'s Options::refine_on_thread_cpu.
        refine_on_thread_cpu: bool = False

    def __init__(self, opts: Options, model: BatchModel | list[BatchModel], metrics: Metrics,
                 abort: Callable[[], None] | None = None, lone: BatchModel | None = None):
        """`model`: one per worker (a list) or a single one. `abort` (optional) makes the model runs in
        progress fail; stop uses it. `lone` (optional): the model for a batch that starts while no
        other batch runs and no sequence is left waiting."""
        self._opts = opts
        models = model if isinstance(model, list) else [model]
        self._abort = abort
        self._lone = lone
        self._metrics = metrics
        self._mu = threading.Lock()
        self._work_cv = threading.Condition(self._mu)  # for the batcher thread: a job arrived or was cancelled, stop
        self._idle_cv = threading.Condition(self._mu)  # for drain: _in_flight reached 0
        self._queue: dict[int, _Queued] = {}  # by sequence id, which is arrival order
        # The planner's view of the queue, kept beside it (planner.QueueIndex): a decision then reads
        # O(max_batch_size) of it instead of rebuilding and sorting every waiting sequence.
        self._index = QueueIndex()
        self._arrivals = ArrivalRate()  # the planner waits for partners only when some are expected
        # The queue's tokens and their model time.
        self._work = QueueWork(len(models), opts.max_queue_wait_us, opts.seed_us_per_token, opts.planner.max_batch_us)
        self._next_seq_id = 1
        # Fair order: where each caller's last turn ended (its next one starts there, or at the head
        # when that is later), and the queue's virtual time (the head of an empty queue).
        self._turn_end: dict[str, int] = {}
        self._sweep_at = 64  # the table's size past which it is swept
        self._virtual = 0
        self._in_flight = 0  # accepted, callback not yet run
        self._running = 0  # batches taken and not yet recorded: a lone one is chosen when this is 0
        # The lone batch running, if one is, and whether another batch started beside it; no lone batch
        # starts before _lone_hold_until_us (_now_us's clock).
        self._lone_running = self._lone_overlapped = False
        self._lone_hold_until_us = 0
        self._accepting = True
        self._stopping = False
        self._idle_due_us: int | None = None  # when on_idle runs if nothing starts before (_now_us)
        self._refined_seen = 0 if opts.cost is None else opts.cost.observed  # batches on_refined was told of
        # The batcher threads, one per model worker: each plans, then runs, one batch at a time.
        self._threads = [threading.Thread(target=self._loop, args=(m,), name=f"rmscore-batcher-{i}", daemon=True)
                         for i, m in enumerate(models)]
        for t in self._threads:
            t.start()

    # ---- callers' API ------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Accept the job (its `done` then runs exactly once, later) or raise ScoreError at once:
        RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE while draining (`done` never runs)."""
        with self._mu:
            if job.finished:  # cancelled before it was submitted
                raise job.error
            arrival = _now_us()
            if job.deadline_s is not None:
                job.deadline_us = int(job.deadline_s * 1e6)
            refused = self._refusal_locked(len(job.seqs)) or self._work_refusal_locked(
                arrival, job.deadline_us, job.caller, max((len(s) for s in job.seqs), default=0),
                len(job.seqs[0]) if job.seqs else 0, sum(len(s) for s in job.seqs),
                len(job.seqs[-1]) if job.seqs else 0)
            if refused is not None:
                job.finished, job.error = True, refused  # never answered: a later cancel does nothing
                raise refused
            job.accepted = True
            job.accepted_at = time.monotonic()
            job.first_seq_id = self._next_seq_id
            self._arrivals.add(len(job.seqs), arrival)
            head = self._head_locked()
            start = self._turn_start_locked(job.caller, head)
            for i, seq in enumerate(job.seqs):
                self._queue[self._next_seq_id] = _Queued(job, i, arrival)
                # Ranked by where its turn ends.
                self._index.add(Waiting(self._next_seq_id, arrival, len(seq), job.deadline_us), start + len(seq))
                self._work.add(len(seq), job.caller)
                start += len(seq)
                self._next_seq_id += 1
            self._turn_end[job.caller] = start
            if len(self._turn_end) > self._sweep_at:
                # Callers whose turns end at or before the head start there anyway: forget them. Swept
                # again only once the table has doubled: where many turns end past the head (a client
                # opening a connection per request is a new caller every time, each a turn past it),
                # most entries survive, and sweeping at each submit rebuilt the whole table under the
                # lock (7% of py-http's event loop in a profile, with the head of then, which stayed).
                self._turn_end = {c: r for c, r in self._turn_end.items() if r > head}
                self._sweep_at = 64 + 2 * len(self._turn_end)
            self._in_flight += 1
            self._queue_changed_locked()
            self._progress_locked(arrival)
            self._metrics.in_flight(+1)
            self._work_cv.notify()

    def work_refusal(self, deadline_s: float | None, caller: str = "") -> ScoreError | None:
        """Why any request of `caller` with this deadline (time.monotonic, or None) would be refused by
        the work ahead of it now, or None: the check front ends make before decoding and validating a
        request, which for a 128 x 512-token one costs more than answering it (submit checks again,
        with its size)."""
        with self._mu:
            if not self._accepting:
                return _draining()
            return self._work_refusal_locked(_now_us(), None if deadline_s is None else int(deadline_s * 1e6), caller)

    def _head_locked(self) -> int:
        """Precondition: _mu held. The head of the turns: the virtual time, or the lowest rank queued
        when that is lower (a sequence that came while a batch ran, at the head then, can rank before
        where that batch's first turn ended, to which the virtual time moves when it ends)."""
        return min(self._index.first_rank(), self._virtual) if len(self._index) else self._virtual

    def _turn_start_locked(self, caller: str, head: int) -> int:
        """Precondition: _mu held. Where `caller`'s next turn starts: where its previous one ended, or
        at `head` when that is later."""
        return max(head, self._turn_end.get(caller, head))

    def _work_refusal_locked(self, now_us: int, deadline_us: int | None, caller: str,
                             longest: int = 0, first: int = 0, total: int = 0, last: int = 0) -> ScoreError | None:
        """Precondition: _mu held. Why a request of `caller` whose longest sequence is `longest`, first
        `first` and last `last` long, `total` tokens in all (0: not read yet), is refused by the work
        ahead of it, or None: the running batches and every queued sequence ranked at or before where
        its first would rank (admission.py: the caller's own queued work, and each other caller's whose
        turn ends by then; unread, the first counts as one token), and its own batch: its longest
        sequence alone, or with partners padded to the longest of it and the queue, at most
        max_batch_tokens. Its deadline is held to its last sequence: the queued work ranked at or before
        where that one's turn ends, and its own sequences before it."""
        start = self._turn_start_locked(caller, self._head_locked())
        ahead = self._index.tokens_through(start + max(first, 1))
        before_last = None
        if total > first:  # several sequences
            before_last = self._index.tokens_through(start + total) + total - last
        cfg = self._opts.planner
        own = longest
        if cfg.max_batch_size > 1:
            padded = max(longest, self._index.by_length[-1][0] if self._index.by_length else 0)
            own = max(longest, min(cfg.max_batch_tokens, cfg.max_batch_size * padded))
        return self._work.refusal(now_us, deadline_us, ahead, own, before_last)

    def _refusal_locked(self, n: int) -> ScoreError | None:
        """Precondition: _mu held. Why a job of `n` sequences cannot be accepted now (None when it can):
        overload and draining are refused at once, never queued."""
        if not self._accepting:
            return _draining()
        waiting = len(self._queue)
        if waiting + n <= self._opts.max_queue_sequences:
            return None
        return ScoreError(Code.RESOURCE_EXHAUSTED,
                          f"queue full: {waiting} sequences waiting + {n} requested exceed "
                          f"max_queue_sequences {self._opts.max_queue_sequences}")

    def cancel(self, job: Job) -> None:
        """The caller gave up (client cancelled): the job is answered CANCELLED now, on the calling
        thread, and its queued sequences are dropped."""
        answers: list[Job] = []
        with self._mu:
            self._fail_locked(job, ScoreError(Code.CANCELLED, "cancelled by the client"), "cancelled", answers)
            self._work_cv.notify()  # the oldest sequence may have left: the wait changes
        self._answer(answers)

    def drain(self, deadline_s: float) -> bool:
        """Refuse new jobs from now on; wait until every accepted job is answered or `deadline_s`
        (time.monotonic) passes. True when drained."""
        with self._mu:
            self._accepting = False
            return self._idle_cv.wait_for(lambda: self._in_flight == 0, max(0.0, deadline_s - time.monotonic()))

    def stop(self, join_timeout_s: float = 30.0) -> None:
        """Refuse new jobs, fail the queued ones UNAVAILABLE, abort the model runs in progress (their
        jobs fail UNAVAILABLE too), end the batcher threads and hand on_refined what it was not told.
        Without `abort` (torch cannot interrupt a run) the running batch's jobs are answered when it
        ends, if the transport is still up."""
        answers: list[Job] = []
        with self._mu:
            self._accepting = False
            self._stopping = True
            while self._queue:
                self._fail_locked(next(iter(self._queue.values())).job, _draining(), None, answers)
            self._work_cv.notify_all()  # every batcher thread must see _stopping
        self._answer(answers)
        if self.running():  # else stopped before
            if self._abort:
                self._abort()
            until = time.monotonic() + join_timeout_s
            for t in self._threads:
                t.join(max(0.0, until - time.monotonic()))
        # A server under load to the end is never idle for on_refined's second: keep the table the
        # batches refined since the last idle spell now, or a restart would plan without it.
        with self._mu:
            refined = self._refined_locked()
        self._tell_refined(refined)

    def running(self) -> bool:
        """A batcher thread is still alive (after stop: a batch is still in a model)."""
        return any(t.is_alive() for t in self._threads)

    # ---- the batcher thread ----------------------------------------------------------------------------
    def _loop(self, model: BatchModel) -> None:
        while True:
            answers: list[Job] = []
            with self._mu:
                if self._stopping:
                    return
                batch = self._next_batch_locked(answers)
                run_on = model
                if batch is not None:
                    now = _now_us()
                    if self._queue:
                        self._work_cv.notify()  # work is left: an idle worker may take the next batch
                    elif self._running == 0 and self._lone is not None and now >= self._lone_hold_until_us:
                        # Alone, and nothing waits to join it: every thread. A batch taken while it runs
                        # goes to its own worker's session and shares the cores until this one ends.
                        # Lone batches pause while batches show more than one caller's work
                        # (_lone_hold_locked).
                        run_on = self._lone
                    if run_on is not model:
                        self._lone_running, self._lone_overlapped = True, False
                    elif self._lone_running:
                        self._lone_overlapped = True
                    self._running += 1
                    self._idle_due_us = None
                    # Here, not when the batch left the queue: taking it and counting it running are one
                    # step under _mu, so the clock never sees the work gone between the two.
                    batch.started_us = now
                    if self._opts.progress is not None:
                        self._opts.progress.batch_started(batch.started_us, len(self._queue))
            self._answer(answers)
            if batch is not None:
                self._run(batch, run_on, lone=run_on is not model)
            # Not held while this thread waits for the next batch (the next turn replaces it only after
            # the wait): the batch's jobs, and through them every sequence of their requests, would stay
            # resident as long as the server is idle (4 abandoned 1024-pair requests kept +34 MiB of
            # token lists: docs/hardening.md).
            batch = None

    def _refined_locked(self) -> tuple[CostTable, int] | None:
        """Precondition: _mu held. The cost table and the batches that refined it since on_refined was
        last told, or None when none did (or nobody listens)."""
        cost = self._opts.cost
        if self._opts.on_refined is None or cost is None or cost.observed == self._refined_seen:
            return None
        batches, self._refined_seen = cost.observed - self._refined_seen, cost.observed
        return cost.table, batches

    def _idle(self, refined: tuple[CostTable, int] | None) -> None:
        """Without _mu: the idle hooks. What they raise is ignored: memory or a table kept is not a
        failed request."""
        if self._opts.on_idle is not None:
            try:
                self._opts.on_idle()
            except Exception:  # noqa: BLE001
                pass
        self._tell_refined(refined)

    def _tell_refined(self, refined: tuple[CostTable, int] | None) -> None:
        """Without _mu: on_refined with what _refined_locked returned, if anything; what it raises is
        ignored (a table not kept is not a failed request)."""
        if refined is not None:
            try:
                self._opts.on_refined(*refined)
            except Exception:  # noqa: BLE001
                pass

    def _next_batch_locked(self, answers: list[Job]) -> _Batch | None:
        """Precondition: _mu held (released while on_idle runs). Waits until there is something to do: returns the next batch,
        taken off the queue and packed, or None with the jobs that expired meanwhile in `answers`,
        or None when stopping."""
        while not self._stopping:
            if not self._queue:
                due = self._idle_due_us if self._running == 0 else None
                if due is None:
                    self._work_cv.wait()
                elif due > _now_us():
                    self._work_cv.wait((due - _now_us()) / 1e6)
                else:
                    self._idle_due_us = None
                    refined = self._refined_locked()
                    self._mu.release()  # never across a model run: on_idle may run one
                    try:
                        self._idle(refined)
                    finally:
                        self._mu.acquire()
                continue
            now = _now_us()
            expired = ScoreError(Code.DEADLINE_EXCEEDED, "deadline exceeded before scoring")
            for seq_id in self._index.expired(now):
                # All of a job's sequences share its deadline: the first one fails (and removes) them all.
                q = self._queue.get(seq_id)
                if q is not None:
                    self._fail_locked(q.job, expired, "deadline", answers)
            cost = self._opts.cost.table if self._opts.cost is not None else None
            decision = plan_live(self._index, now, self._opts.planner, cost, self._work.us_per_token,
                                 self._arrivals.per_s(now))
            if decision.batch:
                return self._take_batch_locked(decision.batch, now)
            if answers:
                return None
            # An arrival or a cancel wakes it early.
            self._work_cv.wait(None if decision.wait_us is None else decision.wait_us / 1e6)
        return None

    def _take_batch_locked(self, ids: list[int], now_us: int) -> _Batch:
        """Precondition: _mu held. Removes `ids` from the queue and packs them (under _mu, as the C++
        batcher must: there the sequences are views into request messages). Their queue wait ends now.
        The virtual time moves to the start of the first one's turn now, and on when the batch ends
        (`_advance_locked`)."""
        first = min(ids, key=lambda seq_id: (self._index.rank(seq_id), seq_id))
        first_end = self._index.rank(first)
        self._virtual = max(self._virtual, first_end - self._index.get(first).length)
        seqs = [self._remove_locked(seq_id) for seq_id in ids]
        for q in seqs:
            self._metrics.queue_wait((now_us - q.arrival_us) / 1e6)
        input_ids, mask = pad_batch([q.job.seqs[q.index] for q in seqs], self._opts.pad_token_id)
        real = int(mask.sum())
        self._work.batch_started(real)  # work ahead of new arrivals until it ends (admission.py)
        self._queue_changed_locked()
        return _Batch(seqs, input_ids, mask, 1.0 - real / mask.size, real, first_end=first_end)

    def _run(self, b: _Batch, model: BatchModel, lone: bool = False) -> None:
        """Runs one batch on `model` (without _mu), then records its scores or its failure."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        scores: np.ndarray | None = None
        error: ScoreError | None = None
        try:
            scores = np.asarray(model(b.input_ids, b.attention_mask), dtype=np.float32)
            if scores.shape != (len(b.seqs),):
                raise RuntimeError(f"model returned shape {scores.shape} for a batch of {len(b.seqs)}")
        except Exception as e:  # noqa: BLE001 - any runtime failure fails this batch, not the server
            error = ScoreError(Code.INTERNAL, f"batch failed: {e}")
            scores = None
        ms = (time.perf_counter() - t0) * 1e3
        cost_s = time.thread_time() - cpu0 if self._opts.refine_on_thread_cpu else ms / 1e3
        # A failed run still took the model's time: the batch histograms count every run.
        self._metrics.batch_ran(ms / 1e3, len(b.seqs), b.padding_ratio)
        if error is None:
            self._metrics.sequences_scored(len(b.seqs))
        answers: list[Job] = []
        with self._mu:
            if error is not None and self._stopping:
                # A run aborted by stop (the end of the drain grace) is the drain refusing the work,
                # as for the jobs still queued, not a model fault (the C++ batcher's rule).
                error = _draining()
            # The cost table describes the workers' sessions, where batches run under load, which is
            # where the planner's choices matter: a lone run, on every thread, would skew it.
            if self._opts.cost is not None and error is None and not lone:
                self._opts.cost.observe(len(b.seqs), b.input_ids.shape[1], cost_s)
            self._running -= 1
            self._lone_hold_locked(b, lone)
            self._work.batch_ended(b.real_tokens)
            self._advance_locked(b)
            if error is None:
                self._work.observe(ms * 1e3, b.real_tokens)
            self._queue_changed_locked()
            if (self._opts.on_idle or self._opts.on_refined) is not None and not self._queue and self._running == 0:
                self._idle_due_us = _now_us() + self._opts.idle_release_us
                self._work_cv.notify()  # a waiting batcher thread keeps the time
            if self._opts.progress is not None:
                # A failed run counts too: its requests are answered, the batcher is not stuck.
                self._opts.progress.batch_ended(b.started_us, _now_us(), len(self._queue))
            self._scored_locked(b, scores, ms, answers)
            if error is not None:
                # Each job of the batch fails once; its sequences still queued never reach the model.
                for q in b.seqs:
                    self._fail_locked(q.job, error, None, answers)
        self._answer(answers)

    def _advance_locked(self, b: _Batch) -> None:
        """Precondition: _mu held. The batch `b` ended: the virtual time moves on by its real tokens over
        the callers sharing now (the module's "fair order"), at most to the end of its first turn.
        Counted when it ends, not when it starts: callers that came while it ran shared its time (a
        first caller's batch started alone, and moved the head past 31 callers that came meanwhile).
        Counting walks the table of turns, once per batch: 79 us at 2,000 callers (timeit, Intel Xeon)."""
        sharing = max(1, sum(r > self._virtual for r in self._turn_end.values()))
        self._virtual = max(self._virtual, min(b.first_end, self._virtual + -(-b.real_tokens // sharing)))

    def _lone_hold_locked(self, b: _Batch, lone: bool) -> None:
        """Precondition: _mu held, `b` counted out of _running. A batch that ended showing more than one
        caller's work (another batch running or started beside it, work waiting, or several requests in
        it) means batches at once, where a thread per batch beats every thread per batch with the cores
        oversubscribed (docs/batching.md, "Threads"): no lone batch starts for lone_hold_us. One that
        ended showing none means a lone caller: the next batch alone may take every thread at once."""
        several = any(q.job is not b.seqs[0].job for q in b.seqs)
        concurrent = several or bool(self._queue) or self._running > 0 or (lone and self._lone_overlapped)
        if lone:
            self._lone_running = False
        self._lone_hold_until_us = _now_us() + self._opts.lone_hold_us if concurrent else 0

    # ---- shared steps -----------------------------------------------------------------------------------
    def _scored_locked(self, b: _Batch, scores: np.ndarray | None, ms: float, answers: list[Job]) -> None:
        """Precondition: _mu held. Adds the batch's time to each unfinished job in it (once per job)
        and, when `scores` is there, records them; a job whose last sequence that was joins `answers`."""
        seen: set[int] = set()
        for i, q in enumerate(b.seqs):
            job = q.job
            if job.finished:  # cancelled or failed while it ran: answered already
                continue
            if id(job) not in seen:
                seen.add(id(job))
                job.inference_ms += ms
            if scores is None:
                continue
            job.scores[q.index] = scores[i]
            job.remaining -= 1
            if job.remaining == 0:
                job.finished = True
                job.seqs = []  # every one scored (Job.seqs)
                answers.append(job)

    def _fail_locked(self, job: Job, why: ScoreError, drop_reason: str | None, answers: list[Job]) -> None:
        """Precondition: _mu held. Fails `job` with `why` unless it is finished already: it joins
        `answers` and its queued sequences leave the queue (counted as dropped when `drop_reason` is
        set). Its sequences in a running batch stay there; their scores are ignored."""
        if job.finished:
            return
        job.finished = True
        job.error = why
        if not job.accepted:
            return  # cancelled before submit, which refuses it with `why`
        answers.append(job)
        dropped = sum(self._remove_locked(job.first_seq_id + i) is not None for i in range(len(job.seqs)))
        job.seqs = []  # none queued now (a running batch holds its own padded copy)
        self._queue_changed_locked()
        self._progress_locked(_now_us())
        if drop_reason and dropped:
            self._metrics.sequences_dropped(drop_reason, dropped)

    def _remove_locked(self, seq_id: int) -> _Queued | None:
        """Precondition: _mu held. Removes a sequence from the queue (None when it is not there)."""
        q = self._queue.pop(seq_id, None)
        if q is not None:
            self._index.remove(seq_id)
            self._work.remove(len(q.job.seqs[q.index]), q.job.caller)
        return q

    def _queue_changed_locked(self) -> None:
        """Precondition: _mu held. The queue's gauges follow it."""
        self._metrics.set_queue_depth(len(self._queue))
        self._metrics.set_queue_expected_wait(self._work.wait_us() / 1e6)

    def _progress_locked(self, now_us: int) -> None:
        """Precondition: _mu held. The stall clock follows the queue (where batches are taken, the
        loop tells it instead, with the batch: see _loop)."""
        if self._opts.progress is not None:
            self._opts.progress.queue_changed(now_us, len(self._queue))

    def _answer(self, answers: list[Job]) -> None:
        """Without _mu: runs each finished job's callback, then counts it answered (so drain returns
        only once every answer was handed over)."""
        if not answers:
            return
        for job in answers:
            total_ms = (time.monotonic() - job.accepted_at) * 1e3
            job.done(job.error if job.error is not None else Result(job.scores.tolist(), total_ms, job.inference_ms))
        self._metrics.in_flight(-len(answers))
        with self._mu:
            self._in_flight -= len(answers)
            if self._in_flight == 0:
                self._idle_cv.notify_all()
