"""The transport-free micro-batching core shared by the Python gRPC and HTTP servers.

Threads, in the style of Triton's dynamic batcher:
- the *batcher* thread owns the queue: it asks the planner (planner.py) what to
  do, drops expired sequences, and packs the next batch's tensors;
- the *worker* thread runs the model on one batch at a time and answers.
While the worker runs a batch, the batcher forms the next one only if it is
full; otherwise it waits for the worker, so late arrivals can still join.

Every accepted request is finished exactly once (`_Request.finish`), whatever
fails: scored, deadline, cancelled, batch failure, or shutdown.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rmscore.core.errors import Code, ScoreError
from rmscore.core.metrics import Metrics
from rmscore.model.modeling import pad_batch
from rmscore.core.planner import PlannerConfig, Waiting, plan


@dataclass
class Result:
    scores: list[float]
    total_ms: float
    inference_ms: float

    @property
    def queue_ms(self) -> float:
        return max(0.0, self.total_ms - self.inference_ms)


Callback = Callable[["Result | ScoreError"], None]


def _now_us() -> int:
    return time.monotonic_ns() // 1000


class _Request:
    def __init__(self, n: int, deadline_us: int | None, done: Callback):
        self.scores = np.zeros(n, dtype=np.float32)
        self.remaining = n
        self.deadline_us = deadline_us
        self.accepted_us = _now_us()
        self.inference_s = 0.0
        self.item_ids: list[int] = []
        self._done = done
        self.finished = False  # guarded by Batcher._lock

    def finish(self, outcome: "Result | ScoreError") -> None:
        """Called exactly once, outside the batcher lock (callbacks may take their own locks)."""
        self._done(outcome)


@dataclass
class _Item:
    id: int
    req: _Request
    index: int
    ids: list[int]
    arrival_us: int


@dataclass
class _Batch:
    items: list[_Item]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    padding_ratio: float
    requests: list[_Request] = field(default_factory=list)


class Batcher:
    def __init__(self, planner: PlannerConfig, max_queue_sequences: int,
                 score_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], pad_id: int, metrics: Metrics):
        self._cfg = planner
        self._max_queue = max_queue_sequences
        self._score = score_fn
        self._pad_id = pad_id
        self._metrics = metrics
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Guarded by _lock:
        self._queue: OrderedDict[int, _Item] = OrderedDict()  # arrival order
        self._next_id = 0
        self._slot: _Batch | None = None  # the prepared batch waiting for the worker
        self._worker_busy = False
        self._in_flight = 0
        self._accepting = True
        self._stopping = False
        self._threads = [threading.Thread(target=self._batcher_loop, name="rmscore-batcher", daemon=True),
                         threading.Thread(target=self._worker_loop, name="rmscore-worker", daemon=True)]
        for t in self._threads:
            t.start()

    # ---- front-end API -------------------------------------------------------------------
    def submit(self, seqs: list[list[int]], deadline_s: float | None, done: Callback) -> _Request:
        """Queue a validated request; `done` gets a Result or a ScoreError, exactly once.

        `deadline_s` is a time.monotonic() value or None. Raises ScoreError at once when
        the server is draining or the queue is full: overload is refused, never queued.
        """
        deadline_us = None if deadline_s is None else int(deadline_s * 1e6)
        req = _Request(len(seqs), deadline_us, done)
        with self._lock:
            if not self._accepting:
                raise ScoreError(Code.UNAVAILABLE, "not ready: draining")
            waiting = len(self._queue)
            if waiting + len(seqs) > self._max_queue:
                raise ScoreError(Code.RESOURCE_EXHAUSTED,
                                 f"queue full: {waiting} sequences waiting + {len(seqs)} requested exceed "
                                 f"max_queue_sequences {self._max_queue}")
            for i, ids in enumerate(seqs):
                item = _Item(self._next_id, req, i, ids, req.accepted_us)
                self._queue[item.id] = item
                req.item_ids.append(item.id)
                self._next_id += 1
            self._in_flight += 1
            depth = len(self._queue)
            self._wake.notify_all()
        self._metrics.queue_depth(depth)
        return req

    def cancel(self, req: _Request) -> None:
        """The caller went away: its sequences leave the queue without costing model time."""
        self._fail([req], ScoreError(Code.CANCELLED, "cancelled by the client"), drop_reason="cancelled")

    def begin_drain(self) -> None:
        with self._lock:
            self._accepting = False

    def wait_idle(self, timeout_s: float) -> bool:
        """After begin_drain: True once every accepted request was answered."""
        end = time.monotonic() + timeout_s
        with self._lock:
            while self._in_flight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    def stop(self, join_timeout_s: float = 30.0) -> None:
        """Fail whatever is still queued (UNAVAILABLE) and end the threads. A batch already in the
        model cannot be interrupted: its calls are answered when it ends, if the transport is still up."""
        with self._lock:
            self._accepting = False
            self._stopping = True
            reqs = {id(it.req): it.req for it in self._queue.values()}
            if self._slot is not None:  # built but never run: the worker exits without taking it
                reqs.update({id(it.req): it.req for it in self._slot.items})
                self._slot = None
            self._wake.notify_all()
        self._fail(list(reqs.values()), ScoreError(Code.UNAVAILABLE, "not ready: draining"), "cancelled")
        end = time.monotonic() + join_timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.monotonic()))

    def running(self) -> bool:
        """A batcher thread is still alive (after stop: a batch is still in the model)."""
        return any(t.is_alive() for t in self._threads)

    # ---- batcher thread --------------------------------------------------------------------
    def _batcher_loop(self) -> None:
        while True:
            with self._lock:
                # Precondition for planning: the slot is free. While the worker runs, only a full
                # batch is formed ahead of time (planning with an infinite delay yields only full ones).
                while not self._stopping and (self._slot is not None or not self._queue):
                    self._wake.wait()
                if self._stopping:
                    return
                now = _now_us()
                cfg = self._cfg if not self._worker_busy else _no_delay_unless_full(self._cfg)
                decision = plan([Waiting(it.id, it.arrival_us, len(it.ids), it.req.deadline_us)
                                 for it in self._queue.values()], now, cfg)
                expired = {id(self._queue[i].req): self._queue[i].req for i in decision.expired}
                batch_items = [self._queue.pop(i) for i in decision.batch]
                depth = len(self._queue)
                if not batch_items and not expired:
                    # While the worker runs, its completion is what wakes us (notify_all).
                    busy = self._worker_busy or decision.wait_us is None
                    self._wake.wait(None if busy else decision.wait_us / 1e6)
                    continue
            self._metrics.queue_depth(depth)
            if expired:
                self._fail(list(expired.values()), ScoreError(Code.DEADLINE_EXCEEDED,
                                                              "deadline exceeded before scoring"), "deadline")
            if batch_items:
                batch = self._pack(batch_items, now)
                with self._lock:
                    stopped = self._stopping  # stop() ran while packing: it saw neither queue nor slot
                    if not stopped:
                        self._slot = batch
                        self._wake.notify_all()
                if stopped:
                    reqs = {id(it.req): it.req for it in batch_items}
                    self._fail(list(reqs.values()), ScoreError(Code.UNAVAILABLE, "not ready: draining"), "cancelled")
                    return

    def _pack(self, items: list[_Item], now_us: int) -> _Batch:
        ids, mask = pad_batch([it.ids for it in items], self._pad_id)
        padding = 1.0 - float(mask.sum()) / mask.size
        for it in items:
            self._metrics.queue_wait((now_us - it.arrival_us) / 1e6)
        return _Batch(items, ids, mask, padding)

    # ---- worker thread ---------------------------------------------------------------------
    def _worker_loop(self) -> None:
        while True:
            with self._lock:
                while self._slot is None and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                batch, self._slot = self._slot, None
                self._worker_busy = True
                self._wake.notify_all()  # the batcher may plan the next batch now
            self._run(batch)
            with self._lock:
                self._worker_busy = False
                self._wake.notify_all()

    def _run(self, batch: _Batch) -> None:
        t0 = time.perf_counter()
        try:
            scores = np.asarray(self._score(batch.input_ids, batch.attention_mask), dtype=np.float32)
            if scores.shape != (len(batch.items),):
                raise RuntimeError(f"model returned shape {scores.shape} for a batch of {len(batch.items)}")
        except Exception as e:  # noqa: BLE001 - any runtime failure fails this batch, not the server
            reqs = {id(it.req): it.req for it in batch.items}
            self._fail(list(reqs.values()), ScoreError(Code.INTERNAL, f"batch failed: {e}"), None)
            return
        seconds = time.perf_counter() - t0
        self._metrics.batch(len(batch.items), batch.padding_ratio, seconds)
        done: list[_Request] = []
        with self._lock:
            seen = set()
            for it, s in zip(batch.items, scores):
                req = it.req
                if req.finished:
                    continue
                req.scores[it.index] = s
                req.remaining -= 1
                if id(req) not in seen:
                    seen.add(id(req))
                    req.inference_s += seconds
                if req.remaining == 0:
                    req.finished = True
                    self._in_flight -= 1
                    done.append(req)
            if done:
                self._wake.notify_all()
        now = _now_us()
        for req in done:
            req.finish(Result(req.scores.tolist(), (now - req.accepted_us) / 1e3, req.inference_s * 1e3))

    # ---- shared ------------------------------------------------------------------------------
    def _fail(self, reqs: list[_Request], err: ScoreError, drop_reason: str | None) -> None:
        """Finish each unfinished request with `err` and remove its queued sequences."""
        failed = []
        dropped = 0
        with self._lock:
            for req in reqs:
                if req.finished:
                    continue
                req.finished = True
                self._in_flight -= 1
                failed.append(req)
                for i in req.item_ids:
                    if self._queue.pop(i, None) is not None:
                        dropped += 1
            depth = len(self._queue)
            self._wake.notify_all()
        self._metrics.queue_depth(depth)
        if drop_reason and dropped:
            self._metrics.dropped(drop_reason, dropped)
        for req in failed:
            req.finish(err)


def _no_delay_unless_full(cfg: PlannerConfig) -> PlannerConfig:
    # An effectively infinite delay: the planner then dispatches only a full batch.
    return PlannerConfig(cfg.max_batch_size, cfg.max_batch_tokens, 1 << 62, cfg.mode)
