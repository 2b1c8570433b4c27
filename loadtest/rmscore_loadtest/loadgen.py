"""The benchmark's load generator: asyncio phases against one server through rmscore_client.

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
  counted.
* rollouts: makespan of scoring a whole rollout, first send to last score.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np

from rmscore_loadtest.stats import percentiles
from rmscore_loadtest.workload import LengthMix, make_rollout


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


def _error_name(e: BaseException) -> str:
    code = getattr(e, "code", None)
    if callable(code):
        try:
            code = code()
        except Exception:  # noqa: BLE001
            code = None
    name = getattr(code, "name", code)
    return f"{type(e).__name__}({name})" if name else type(e).__name__


def _summarise(records: list[tuple[float, float, int, str | None, float, float]], window_s: float,
               t_end: float) -> dict:
    """records: (t_done_rel, latency_ms, count, error, server_queue_ms, server_inference_ms)."""
    ok = [r for r in records if r[3] is None]
    in_window = [r for r in ok if r[0] <= t_end]
    seqs = sum(r[2] for r in in_window)
    lat = [r[1] for r in in_window]
    errors: dict[str, int] = {}
    for r in records:
        if r[3] is not None:
            errors[r[3]] = errors.get(r[3], 0) + 1
    queue = [r[4] for r in in_window if math.isfinite(r[4])]
    infer = [r[5] for r in in_window if math.isfinite(r[5])]
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


async def _one(client, req, t0: float, sent_at: float, records: list) -> str | None:
    timing = []
    try:
        result = await client.score_ids(req, on_chunk=timing.append)
        if len(result.scores) != len(req):
            raise RuntimeError(f"{len(result.scores)} scores for {len(req)} sequences")
        err = None
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - counted by kind
        err = _error_name(e)
    done = time.perf_counter()
    q = sum(t.queue_ms for t in timing) / len(timing) if timing else float("nan")
    i = sum(t.inference_ms for t in timing) / len(timing) if timing else float("nan")
    records.append((done - t0, (done - sent_at) * 1e3, len(req), err, q, i))
    return err


async def closed_loop(client, requests: list, concurrency: int, window_s: float, settle_s: float = 0.0,
                      drain_timeout_s: float = 60.0, max_settle_s: float = 120.0) -> dict:
    """C workers back to back; see the module docstring for the window and the estimator."""
    records: list = []
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
    await asyncio.sleep(settle_s)
    try:
        await asyncio.wait_for(everyone.wait(), timeout=max(0.0, max_settle_s - settle_s))
    except asyncio.TimeoutError:
        pass
    t_open = time.perf_counter() - t0
    await asyncio.sleep(window_s)
    # At least one answer per worker inside the window, so that a slow server is not measured on
    # a fraction of one round of requests (bounded by max_settle_s).
    while (sum(1 for r in records if r[0] > t_open) < concurrency
           and time.perf_counter() - t0 < t_open + max(window_s, max_settle_s)):
        await asyncio.sleep(0.02)
    t_close = time.perf_counter() - t0
    stop = True
    done, pending = await asyncio.wait(tasks, timeout=drain_timeout_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # Completion to completion: from the last answer at or before the window opened to the last
    # answer inside it. Answers in a closed loop come in waves (the workers start together and a
    # batching server finishes their requests together); counting between two answers, not over
    # a fixed span that starts right after a wave, keeps the rate unbiased.
    anchor = max((r[0] for r in records if r[0] <= t_open), default=t_open)
    measured = [r for r in records if anchor < r[0] <= t_close]
    ok = [r for r in measured if r[3] is None]
    span = (max(r[0] for r in ok) - anchor) if ok else (t_close - t_open)
    out = _summarise(measured, span, t_close)
    out.update(concurrency=concurrency, settle_s=round(t_open, 3), window_open_s=round(t_close - t_open, 3),
               cancelled_at_drain=len(pending))
    return out


async def open_loop(client, requests: list, rate_seq_s: float, chunk_size: int, window_s: float, seed: int,
                    max_outstanding: int = 64, drain_timeout_s: float = 60.0) -> dict:
    """Poisson arrivals at rate_seq_s / chunk_size requests per second for window_s."""
    rate_rps = rate_seq_s / chunk_size
    rng = np.random.default_rng([seed, 3])
    arrivals = []
    t = 0.0
    while True:
        t += rng.exponential(1.0 / rate_rps)
        if t >= window_s:
            break
        arrivals.append(t)
    records: list = []
    tasks: set = set()
    shed = 0
    t0 = time.perf_counter()
    for k, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= max_outstanding:
            shed += 1
            continue
        task = asyncio.create_task(_one(client, requests[k % len(requests)], t0, t0 + at, records))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.sleep(max(0.0, t0 + window_s - time.perf_counter()))
    cancelled = 0
    if tasks:
        done, pending = await asyncio.wait(set(tasks), timeout=drain_timeout_s)
        cancelled = len(pending)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    out = _summarise(records, window_s, window_s)
    # Open loop: every answered request's latency counts, also those answered after the window.
    lat = [r[1] for r in records if r[3] is None]
    out.update(latency_ms=percentiles(lat), latency_mean_ms=float(np.mean(lat)) if lat else float("nan"),
               latencies_ms=[round(x, 3) for x in lat], answered=len(lat))
    out.update(offered_seq_s=rate_seq_s, offered_requests=len(arrivals), shed=shed, cancelled_at_drain=cancelled,
               max_outstanding=max_outstanding)
    return out


async def rollouts(client, batch: list[list[list[int]]]) -> dict:
    """Score each rollout (all chunks in flight together), one after the other."""
    makespans, chunk_lat, errors = [], [], {}
    for rollout in batch:
        timings = []
        t = time.perf_counter()
        try:
            result = await client.score_ids(rollout, on_chunk=timings.append)
            if len(result.scores) != len(rollout):
                raise RuntimeError(f"{len(result.scores)} scores for {len(rollout)} sequences")
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
