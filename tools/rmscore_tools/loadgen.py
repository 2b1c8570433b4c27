"""The one load generator: asyncio phases against one server through rmscore_client.

Used by `rmscore bench` (and its `--overhead` study), `rmscore hardening`'s scenarios and
bench/gpu_check.py.

Every phase is bounded in time and in outstanding requests. One request is one
chunk of `chunk_size` sequences (one RPC); a rollout is `rollout_size`
sequences sent as chunks all in flight together, as a trainer rank does.

* closed loop, concurrency C: C workers, each sends its next request as soon as
  the previous one is answered. The measurement window opens once every worker
  has had an answer (and at least `settle_s` passed): the pipeline is full. It
  stays open `window_s`, and longer if needed until C more answers came (one
  round). Throughput is measured from answer to answer: the sequences answered
  after the last answer before the window opened, up to the last answer in the
  window, over that span (`window_s` in the output). Latency is per request,
  over the same requests.
* open loop, rate R: requests arrive as a Poisson process at R sequences/s,
  whatever the server does; latency runs from the scheduled arrival (so a late
  send counts against the server, no coordinated omission). At most
  `max_outstanding` requests wait at once; arrivals beyond it are shed and
  counted (None: no cap, every arrival is sent, as the overload scenario needs).
* rollouts: makespan of scoring a whole rollout, first send to last score.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rmscore_tools.stats import percentiles
from rmscore_tools.workload import LengthMix, make_rollout


@dataclass(frozen=True)
class Workload:
    mix: LengthMix
    chunk_size: int
    rollout_size: int
    pool_size: int = 256  # distinct requests cycled through by the load phases

    def requests(self, seed: int) -> list[list[list[int]]]:
        rng = np.random.default_rng([seed, 1])
        return [make_rollout(rng, self.chunk_size, self.mix) for _ in range(self.pool_size)]

    def rollouts(self, seed: int, n: int) -> list[list[list[int]]]:
        rng = np.random.default_rng([seed, 2])
        return [make_rollout(rng, self.rollout_size, self.mix) for _ in range(n)]


def error_code(e: BaseException) -> str:
    """The status name of a failed call ("RESOURCE_EXHAUSTED", ...), else the exception's type name."""
    code = getattr(e, "code", None)
    if callable(code):
        try:
            code = code()
        except Exception:  # noqa: BLE001
            code = None
    return getattr(code, "name", code) or type(e).__name__


def _error_name(e: BaseException) -> str:
    code = error_code(e)
    return f"{type(e).__name__}({code})" if code != type(e).__name__ else code


class WrongCount(RuntimeError):
    """An answer with another number of scores than sequences sent."""

    def __init__(self, got: int, sent: int):
        super().__init__(f"{got} scores for {sent} sequences")
        self.code = f"WRONG_COUNT({got}/{sent})"


class Answer(NamedTuple):
    """One request's end. Times in seconds since the phase began; `latency_ms` from when the request
    was due (the scheduled arrival in an open loop), `service_ms` from when it was sent."""

    done_s: float
    latency_ms: float
    sequences: int
    error: str | None  # None, or "Type(CODE)"
    queue_ms: float
    inference_ms: float
    outcome: str  # "OK" or the status name
    sent_s: float
    service_ms: float


def _summarise(records: list[Answer], window_s: float, t_end: float) -> dict:
    ok = [r for r in records if r.error is None]
    in_window = [r for r in ok if r.done_s <= t_end]
    seqs = sum(r.sequences for r in in_window)
    lat = [r.latency_ms for r in in_window]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    queue = [r.queue_ms for r in in_window if math.isfinite(r.queue_ms)]
    infer = [r.inference_ms for r in in_window if math.isfinite(r.inference_ms)]
    return {
        "window_s": window_s,
        "requests": len(in_window),
        "sequences": seqs,
        "throughput_seq_s": seqs / window_s if window_s > 0 else float("nan"),
        "latency_ms": percentiles(lat),
        "latency_mean_ms": float(np.mean(lat)) if lat else float("nan"),
        "server_queue_ms_mean": float(np.mean(queue)) if queue else float("nan"),
        "server_inference_ms_mean": float(np.mean(infer)) if infer else float("nan"),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "late_requests": len(ok) - len(in_window),
        "latencies_ms": [round(x, 3) for x in lat],
    }


async def _score_checked(client, seqs: list, on_chunk) -> None:
    """One score_ids call; an answer with another number of scores than sequences raises WrongCount."""
    result = await client.score_ids(seqs, on_chunk=on_chunk)
    if len(result.scores) != len(seqs):
        raise WrongCount(len(result.scores), len(seqs))


async def _one(client, req, t0: float, due_at: float, records: list) -> str | None:
    timing = []
    sent = time.perf_counter()
    try:
        await _score_checked(client, req, timing.append)
        err, outcome = None, "OK"
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - counted by kind
        err, outcome = _error_name(e), error_code(e)
    done = time.perf_counter()
    q = sum(t.queue_ms for t in timing) / len(timing) if timing else float("nan")
    i = sum(t.inference_ms for t in timing) / len(timing) if timing else float("nan")
    records.append(Answer(done - t0, (done - due_at) * 1e3, len(req), err, q, i, outcome, sent - t0,
                          (done - sent) * 1e3))
    return err


async def _ticker(records: list, t0: float, on_tick, tick_s: float) -> None:
    """on_tick(seconds since t0, {"requests", "errors", "sequences"} so far) every tick_s, until cancelled."""
    while True:
        ok = [r for r in records if r.error is None]
        on_tick(time.perf_counter() - t0, {"requests": len(ok), "errors": len(records) - len(ok),
                                           "sequences": sum(r.sequences for r in ok)})
        await asyncio.sleep(tick_s)


async def closed_loop(client, requests: list, concurrency: int, window_s: float, settle_s: float = 0.0,
                      drain_timeout_s: float = 60.0, max_settle_s: float = 120.0, on_tick=None,
                      tick_s: float = 1.0) -> dict:
    """C workers back to back; see the module docstring for the window and the estimator.
    `on_tick(t, counts)`, if given, is called every `tick_s` while the loop runs (see `_ticker`)."""
    records: list[Answer] = []
    answered = [0] * concurrency
    everyone = asyncio.Event()
    stop = False
    t0 = time.perf_counter()

    async def worker(w: int) -> None:
        k = w * 7919
        while not stop:
            err = await _one(client, requests[k % len(requests)], t0, time.perf_counter(), records)
            k += 1
            answered[w] += 1
            if answered[w] == 1 and all(answered):
                everyone.set()
            if err is not None:
                await asyncio.sleep(0.01)  # a failing server must not turn the client into a busy loop

    tasks = [asyncio.create_task(worker(w)) for w in range(concurrency)]
    ticker = asyncio.create_task(_ticker(records, t0, on_tick, tick_s)) if on_tick is not None else None
    await asyncio.sleep(settle_s)
    try:
        await asyncio.wait_for(everyone.wait(), timeout=max(0.0, max_settle_s - settle_s))
    except asyncio.TimeoutError:
        pass
    t_open = time.perf_counter() - t0
    await asyncio.sleep(window_s)
    # At least one answer per worker inside the window, so that a slow server is not measured on
    # a fraction of one round of requests (bounded by max_settle_s).
    while (sum(1 for r in records if r.done_s > t_open) < concurrency
           and time.perf_counter() - t0 < t_open + max(window_s, max_settle_s)):
        await asyncio.sleep(0.02)
    t_close = time.perf_counter() - t0
    stop = True
    pending = await _drain(tasks, drain_timeout_s)
    if ticker is not None:
        await _drain([ticker], 0)
    out = _window(records, t_open, t_close)
    out.update(concurrency=concurrency, settle_s=round(t_open, 3), window_open_s=round(t_close - t_open, 3),
               cancelled_at_drain=pending, answered_all=len(records))
    return out


async def _drain(tasks: list, timeout_s: float) -> int:
    """Wait up to timeout_s for `tasks` to end, cancel the rest; how many were cancelled."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(set(tasks), timeout=timeout_s) if timeout_s > 0 else (None, set(tasks))
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(pending)


def _window(records: list[Answer], t_open: float, t_close: float) -> dict:
    """Completion to completion: from the last answer at or before the window opened to the last
    answer inside it. Answers in a closed loop come in waves (the workers start together and a
    batching server finishes their requests together); counting between two answers, not over
    a fixed span that starts right after a wave, keeps the rate unbiased."""
    anchor = max((r.done_s for r in records if r.done_s <= t_open), default=t_open)
    measured = [r for r in records if anchor < r.done_s <= t_close]
    ok = [r for r in measured if r.error is None]
    span = (max(r.done_s for r in ok) - anchor) if ok else (t_close - t_open)
    return _summarise(measured, span, t_close)


def poisson_arrivals(rate_rps: float, window_s: float, rng) -> list[float]:
    """Arrival times in [0, window_s) of a Poisson process at rate_rps."""
    arrivals, t = [], 0.0
    while (t := t + rng.exponential(1.0 / rate_rps)) < window_s:
        arrivals.append(t)
    return arrivals


async def open_loop(client, requests: list, rate_seq_s: float, chunk_size: int, window_s: float, seed: int,
                    max_outstanding: int | None = 64, drain_timeout_s: float = 60.0,
                    keep_outcomes: bool = False) -> dict:
    """Poisson arrivals at rate_seq_s / chunk_size requests per second for window_s; at most
    `max_outstanding` requests waiting (None: no client-side cap, every arrival is sent).
    `keep_outcomes` adds "outcomes": one {"sent_s", "ms" (from the send), "outcome", "sequences"}
    per arrival sent, {"outcome": "NO_ANSWER"} for one cancelled at the drain."""
    arrivals = poisson_arrivals(rate_seq_s / chunk_size, window_s, np.random.default_rng([seed, 3]))
    records: list[Answer] = []
    tasks: set = set()
    shed = 0
    t0 = time.perf_counter()
    for k, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if max_outstanding is not None and len(tasks) >= max_outstanding:
            shed += 1
            continue
        task = asyncio.create_task(_one(client, requests[k % len(requests)], t0, t0 + at, records))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.sleep(max(0.0, t0 + window_s - time.perf_counter()))
    cancelled = await _drain(list(tasks), drain_timeout_s)
    out = _summarise(records, window_s, window_s)
    # Open loop: every answered request's latency counts, also those answered after the window.
    lat = [r.latency_ms for r in records if r.error is None]
    out.update(latency_ms=percentiles(lat), latency_mean_ms=float(np.mean(lat)) if lat else float("nan"),
               latencies_ms=[round(x, 3) for x in lat], answered=len(lat))
    out.update(offered_seq_s=rate_seq_s, offered_requests=len(arrivals), shed=shed, cancelled_at_drain=cancelled,
               max_outstanding=max_outstanding)
    if keep_outcomes:
        out["outcomes"] = [{"sent_s": r.sent_s, "ms": r.service_ms, "outcome": r.outcome, "sequences": r.sequences}
                           for r in records] + [{"outcome": "NO_ANSWER"}] * cancelled
    return out


async def rollouts(client, batch: list[list[list[int]]]) -> dict:
    """Score each rollout (all chunks in flight together), one after the other."""
    makespans, chunk_lat, errors = [], [], {}
    for rollout in batch:
        timings = []
        t = time.perf_counter()
        try:
            await _score_checked(client, rollout, timings.append)
        except Exception as e:  # noqa: BLE001
            errors[_error_name(e)] = errors.get(_error_name(e), 0) + 1
            continue
        makespans.append(time.perf_counter() - t)
        chunk_lat += [x.latency_ms for x in timings]
    return {
        "rollouts": len(batch),
        "rollout_size": len(batch[0]) if batch else 0,
        "makespans_s": [round(m, 5) for m in makespans],
        "makespan_s_mean": float(np.mean(makespans)) if makespans else float("nan"),
        "chunk_latency_ms": percentiles(chunk_lat),
        "errors": sum(errors.values()),
        "error_kinds": errors,
    }


async def warmup(client, requests: list, concurrency: int, seconds: float) -> dict:
    if seconds <= 0:
        return {"seconds": 0, "requests": 0}
    r = await closed_loop(client, requests, concurrency, seconds, drain_timeout_s=120, max_settle_s=0)
    return {"seconds": seconds, "requests": r["requests"], "errors": r["errors"]}


async def score_set(client, seqs: list[list[int]]) -> list[float]:
    return [float(x) for x in (await client.score_ids(seqs)).scores]
