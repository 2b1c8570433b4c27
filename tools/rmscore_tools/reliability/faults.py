"""Fault scenarios against a real, started server: overload, kill and restart, drain, cancellation, soak.

Each scenario drives a server that `start(kind, ...)` launched (rmscore_tools.launch's
launcher, with a pinned port when a killed server must come back where its clients
look for it) and returns a dict of plain figures: the tests assert on them,
`rmscore hardening` reports them (docs/hardening.md).

* `overload`: capacity from a short closed loop, then Poisson arrivals at
  `factor` x capacity for `seconds`, every request sent at once whatever the
  server does (open loop, no client cap): each request must end OK or
  RESOURCE_EXHAUSTED, never in silence or in another error.
* `kill_restart`: a rollout through rmscore_client with retries (in a process of its own); the server is
  SIGKILLed by PID mid-rollout and restarted on the same port; the rollout must
  end with one score per sequence, in order, each chunk answered once.
* `drain`: requests in flight, SIGTERM, a health poller and a prober racing it:
  NOT_SERVING must show before the first refusal, accepted work is answered,
  the process exits 0 within the grace period.
* `cancel`: rounds of clients that cancel (or drop their channel) mid-request:
  their sequences are dropped (metric), the model scores far fewer than were
  offered, in-flight returns to 0, resident memory does not climb per round.
* `soak`: steady closed-loop load for `seconds`, resident memory sampled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import math
import os
import pathlib
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from rmscore_tools import launch
from rmscore_tools import caller, loadgen
from rmscore_tools.observe import metric, rss_mb  # noqa: F401 - part of this module's figures API
from rmscore_tools.stats import percentiles
from rmscore_tools.workload import LengthMix, make_rollout

ROOT = launch.ROOT
MODEL = ROOT / "models" / "default"
# Small limits so that a 2-core machine fills the queue within seconds, with the tests' queue delay and
# thread count (tests/servers.py); the same for every kind.
FLAGS = dict(max_queue_sequences=256, max_sequences_per_request=128, max_batch_size=16, drain_grace_seconds=60,
             max_queue_delay_ms=2, intra_op_threads=1)
LIGHT_LENGTHS = "lognormal:64:0.5:16:256"


# ---- servers -------------------------------------------------------------------------------

def start(kind: str, port: int = 0, ready_timeout_s: float = 400, model: str | os.PathLike | None = None,
          **flags) -> launch.RunningServer:
    """Start `kind` on `port` (0: ephemeral) with FLAGS overridden by `flags`; a RunningServer once ready.
    A restarted server passes its old port, so it comes back where its clients look."""
    return launch.start(kind, port, ready_timeout_s=ready_timeout_s, model=str(model or MODEL),
                        log_dir=tempfile.mkdtemp(prefix=f"rmscore-faults-{kind}-"), **{**FLAGS, **flags})


def wait_idle(server, timeout_s: float = 60) -> bool:
    """True once nothing is in flight or queued (the server is done with what it accepted)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if metric(server, "rmscore_requests_in_flight") == 0 and metric(server, "rmscore_queue_depth") == 0:
            return True
        time.sleep(0.1)
    return False


def golden_ok(server, tolerance: float = 1e-4) -> bool:
    """The manifest's golden sequences score as exported: the server answers, and answers right."""
    manifest = json.loads((MODEL / "manifest.json").read_text())
    ids = [g["input_ids"] for g in manifest["golden"]]
    want = np.array([g["score"] for g in manifest["golden"]])

    async def run():
        c = caller.async_client(server.transport, caller.target_of(server), chunk_size=len(ids), timeout_s=60)
        try:
            return await loadgen.score_set(c, ids)
        finally:
            await c.close()
    try:
        got = np.array(asyncio.run(run()))
    except Exception:  # noqa: BLE001 - any failure is "not serving normally"
        return False
    return bool(got.shape == want.shape and np.abs(got - want).max() <= tolerance)


def _requests(lengths: str, chunk_size: int, seed: int, pool: int = 128) -> list:
    return loadgen.Workload(LengthMix.parse(lengths), chunk_size, chunk_size, pool_size=pool).requests(seed)


# ---- overload ------------------------------------------------------------------------------

async def _capacity(server, requests, concurrency: int, seconds: float) -> float:
    c = caller.async_client(server.transport, caller.target_of(server), chunk_size=len(requests[0]), timeout_s=120)
    try:
        await loadgen.warmup(c, requests, concurrency, min(2.0, seconds))
        r = await loadgen.closed_loop(c, requests, concurrency, seconds, settle_s=0.5, max_settle_s=60)
    finally:
        await c.close()
    if not r["throughput_seq_s"] > 0:
        raise RuntimeError(f"{server.kind}: no capacity measured: {r['errors']} errors {r['error_kinds']}, "
                           f"{r['requests']} requests in the window")
    return r["throughput_seq_s"]


async def _open_loop(server, requests, rate_seq_s: float, seconds: float, seed: int, timeout_s: float) -> list:
    """Poisson arrivals, each sent at its time with no client-side cap; one outcome per request."""
    c = caller.async_client(server.transport, caller.target_of(server), chunk_size=len(requests[0]),
                            timeout_s=timeout_s)
    try:
        r = await loadgen.open_loop(c, requests, rate_seq_s, len(requests[0]), seconds, seed, max_outstanding=None,
                                    drain_timeout_s=timeout_s + 30, keep_outcomes=True)
    finally:
        await c.close()
    return r["outcomes"]


def overload(server, *, seconds: float = 20.0, factor: float = 4.0, chunk_size: int = 8,
             capacity_seconds: float = 4.0, concurrency: int = 8, lengths: str = LIGHT_LENGTHS, seed: int = 0,
             timeout_s: float = 120.0) -> dict:
    """`factor` x the measured capacity, open loop, for `seconds`: one answer per request, refusals fast."""
    requests = _requests(lengths, chunk_size, seed)
    capacity = asyncio.run(_capacity(server, requests, concurrency, capacity_seconds))
    queue = server.flags.get("max_queue_sequences", FLAGS["max_queue_sequences"])
    if factor > 1:  # long enough that the excess over capacity overflows the queue, however slow the kind
        seconds = max(seconds, 1.5 * queue / ((factor - 1) * capacity))
    t0 = time.perf_counter()
    records = asyncio.run(_open_loop(server, requests, factor * capacity, seconds, seed, timeout_s))
    wall_s = time.perf_counter() - t0
    idle = wait_idle(server, 60)
    ok = [r for r in records if r["outcome"] == "OK"]
    refused = [r for r in records if r["outcome"] == "RESOURCE_EXHAUSTED"]
    lost = [r for r in records if r["outcome"] not in ("OK", "RESOURCE_EXHAUSTED")]
    kinds: dict[str, int] = {}
    for r in lost:
        kinds[r["outcome"]] = kinds.get(r["outcome"], 0) + 1
    after = _steady(server, requests, concurrency=2, seconds=2.0)
    golden = golden_ok(server)
    queue_bound_s = queue / max(capacity, 1e-9)
    return {
        "kind": server.kind, "seconds": seconds, "factor": factor, "chunk_size": chunk_size, "lengths": lengths,
        "capacity_seq_s": capacity, "offered_seq_s": factor * capacity, "offered": len(records),
        "answered": len(ok) + len(refused), "accepted": len(ok), "refused": len(refused), "lost": len(lost),
        "lost_kinds": kinds, "refused_fraction": len(refused) / max(1, len(records)),
        "served_seq_s": sum(r["sequences"] for r in ok) / wall_s,
        "refuse_ms": percentiles([r["ms"] for r in refused]),
        "accepted_ms": percentiles([r["ms"] for r in ok]),
        # Waiting behind a full queue at the measured capacity: what "bounded latency" is held to.
        "queue_drain_bound_ms": queue_bound_s * 1e3,
        "refuse_ms_all": [round(r["ms"], 3) for r in refused],
        "idle_after": idle, "golden_after": golden, "after_errors": after["errors"],
        "served_normally_after": bool(idle and after["errors"] == 0 and after["requests"] > 0 and golden),
    }


# ---- kill and restart ----------------------------------------------------------------------

def reference_scores(seqs: list[list[int]], model: pathlib.Path = MODEL) -> np.ndarray:
    """In-process ONNX Runtime, each sequence alone: the scores every server must give."""
    import onnxruntime as ort

    from rmscore.model.padding import pad_batch

    pad = json.loads((model / "manifest.json").read_text())["pad_token_id"]
    sess = ort.InferenceSession(str(model / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.array([sess.run(["scores"], dict(zip(("input_ids", "attention_mask"), pad_batch([s], pad))))[0][0]
                     for s in seqs])


def kill_restart(server, *, sequences: int = 256, chunk_size: int = 8, max_concurrency: int = 4,
                 kill_at_fraction: float = 0.3, lengths: str = "uniform:16:128", seed: int = 1,
                 restart_timeout_s: float = 400, tolerance: float = 1e-4) -> tuple[dict, object]:
    """SIGKILL `server` once `kill_at_fraction` of a rollout's chunks are answered, restart it on the same
    port; the client's retries finish the rollout. Returns (figures, the restarted server)."""
    seqs = make_rollout(np.random.default_rng([seed, 5]), sequences, LengthMix.parse(lengths))
    want = reference_scores(seqs)
    n_chunks = (sequences + chunk_size - 1) // chunk_size
    fig: dict = {"kind": server.kind, "sequences": sequences, "chunks": n_chunks, "chunk_size": chunk_size}
    t0 = time.monotonic()
    # The client is a process of its own (retried_rollout says why): this one only kills, restarts and
    # reads the client's answers, so no gRPC runs here until the client has exited.
    rollout = _RolloutChild(server, seqs, chunk_size, max_concurrency, timeout_s=restart_timeout_s + 120)
    new = None
    try:
        kill_after = kill_at_fraction * n_chunks
        end = time.monotonic() + restart_timeout_s + 180
        rollout.read_until(end, stop=lambda: len(rollout.answered) >= kill_after)
        fig["answered_before_kill"] = len(rollout.answered)
        fig["killed_mid_run"] = len(rollout.answered) < n_chunks and rollout.alive()
        fig["in_flight_at_kill"] = metric_safe(server, "rmscore_requests_in_flight")
        server.proc.send_signal(signal.SIGKILL)  # the PID this session started, nothing else
        fig["killed_exit_code"] = server.proc.wait(30)
        t_kill = time.monotonic()
        new = _restart(server, restart_timeout_s)
        rollout.read_until(end)
    finally:
        rollout.close()
    fig["rollout_s"] = time.monotonic() - t0
    new.wait_until_ready(time.monotonic() + restart_timeout_s)
    # Kill to the first chunk answered after it: how long the client saw no service.
    fig["restart_s"] = min((t for t in rollout.answer_times if t > t_kill), default=math.nan) - t_kill
    fig["same_port"] = new.port == server.port
    fig.update(_rollout_figures(rollout, want, n_chunks, tolerance))
    return fig, new


class _RolloutChild:
    """retried_rollout running `seqs` against `server` in a child process; its answers are read on the
    calling thread (`read_until`), one JSON line each."""

    def __init__(self, server, seqs, chunk_size: int, max_concurrency: int, timeout_s: float):
        self.answered: dict[int, int] = {}
        self.answer_times: list[float] = []
        self.attempts: list[int] = []
        self.result: dict = {}
        self.proc = subprocess.Popen([sys.executable, "-m", "rmscore_tools.reliability.retried_rollout"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        job = {"target": caller.target_of(server), "transport": server.transport, "seqs": seqs,
               "chunk_size": chunk_size, "max_concurrency": max_concurrency, "timeout_s": timeout_s}
        self.proc.stdin.write(json.dumps(job))
        self.proc.stdin.close()
        # A reader thread (no gRPC in it) so that the calling thread can wait with a deadline.
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def alive(self) -> bool:
        return not self.result

    def read_until(self, deadline: float, stop=lambda: False) -> None:
        """Take answers until the client's last line, `stop()`, or `deadline` (then the result is an error)."""
        while self.alive() and not stop():
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.result["error"] = "DEADLINE_EXCEEDED: the rollout did not end in time"
                return
            if line is None:  # the client exited without its last line: it crashed
                self.result["error"] = f"client process died (exit code {self.proc.wait(30)})"
                return
            msg = json.loads(line)
            if "offset" in msg:
                self.answer_times.append(msg["t"])
                self.answered[msg["offset"]] = self.answered.get(msg["offset"], 0) + 1
                self.attempts.append(msg["attempts"])
            else:
                self.result = msg

    def close(self) -> None:
        if self.proc.poll() is None and "scores" not in self.result:
            self.proc.kill()  # the child this call started
        self.proc.wait(30)


def _restart(server, ready_timeout_s: float):
    """`server`'s kind and flags again on its port, once bound (not yet checked for health)."""
    for _ in range(20):  # a port held a moment longer by the kernel: try again rather than give up
        try:
            return start(server.kind, port=server.port, ready_timeout_s=ready_timeout_s, wait_ready=False,
                         **dict(server.flags))
        except RuntimeError as e:
            if "did not bind" not in str(e):
                raise
            time.sleep(0.5)
    raise RuntimeError(f"{server.kind}: could not restart on port {server.port}")


def _rollout_figures(rollout: _RolloutChild, want: np.ndarray, n_chunks: int, tolerance: float) -> dict:
    scores = rollout.result.get("scores")
    got = np.array(scores if scores is not None else [])
    answered, attempts = rollout.answered, rollout.attempts
    fig = {"client_error": rollout.result.get("error"), "scores": len(got),
           "chunks_answered_once": sum(1 for v in answered.values() if v == 1),
           "chunks_answered_twice": sum(1 for v in answered.values() if v > 1),
           "chunks_retried": sum(1 for a in attempts if a > 1), "max_attempts": max(attempts, default=0),
           "max_abs_error": float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")}
    fig["complete_unique_correct"] = bool(
        scores is not None and got.shape == want.shape and fig["max_abs_error"] <= tolerance
        and len(answered) == n_chunks and fig["chunks_answered_twice"] == 0)
    return fig


def metric_safe(server, name: str, **labels) -> float | None:
    try:
        return metric(server, name, **labels)
    except Exception:  # noqa: BLE001 - a figure for the report, not a requirement
        return None


# ---- drain ---------------------------------------------------------------------------------

def _probe_score(c: caller.Caller, seqs: list[list[int]], timeout_s: float = 120) -> tuple[str, str]:
    """(code, detail): ("OK", n scores) or the refusal's code and message. On HTTP, a call that got no
    answer at all (the listener gone) counts as UNAVAILABLE, as gRPC names it."""
    return call_outcome(c, lambda: len(c.score_ids(seqs, timeout_s=timeout_s).scores))


def call_outcome(c: caller.Caller, call) -> tuple[str, str]:
    """(code, detail) of `call()`, which returns a count of scores: ("OK", that count) or the refusal's."""
    try:
        return "OK", str(call())
    except caller.CallError as e:
        return e.code, e.message[:200]
    except Exception as e:  # noqa: BLE001
        return loadgen.error_code(e) if c.grpc else "UNAVAILABLE", str(e)[:200]


class _DrainWatch:
    """Threads that race a SIGTERM: `in_flight` heavy requests, a health poller, and a Score prober
    sending a new small request every interval (each on its own thread: a probe accepted just before
    the signal waits behind the in-flight work and must not hold back the probes after it)."""

    def __init__(self, server, reqs: list, grace_s: float, probe_interval_s: float):
        self.server, self.reqs, self.grace_s, self.interval = server, reqs, grace_s, probe_interval_s
        self.results: list = [None] * len(reqs)
        self.stop, self.signalled = threading.Event(), threading.Event()
        self.health: list[tuple[float, float, bool | None]] = []   # (sent, answered, serving)
        self.probes: list[tuple[float, float, str, str]] = []      # (sent, answered, code, detail)
        self.workers = [threading.Thread(target=self._heavy, args=(i,), daemon=True) for i in range(len(reqs))]
        self.watchers = [threading.Thread(target=self._poll_health, daemon=True),
                         threading.Thread(target=self._probe, daemon=True)]

    def _caller(self) -> caller.Caller:
        return caller.Caller.to(self.server, timeout_s=30)

    def _heavy(self, i: int) -> None:
        c = self._caller()
        try:
            self.results[i] = _probe_score(c, self.reqs[i], timeout_s=self.grace_s + 60)
        finally:
            c.close()

    def _poll_health(self) -> None:
        c = self._caller()
        try:
            while not self.stop.is_set():
                t = time.perf_counter()
                s = c.is_serving(timeout_s=5)
                self.health.append((t, time.perf_counter(), s))
                time.sleep(self.interval)
        finally:
            c.close()

    def _probe(self) -> None:
        c = self._caller()

        def once() -> None:
            t = time.perf_counter()
            code, detail = _probe_score(c, [[101, 2023, 102]], timeout_s=self.grace_s + 60)
            self.probes.append((t, time.perf_counter(), code, detail))

        with cf.ThreadPoolExecutor(64) as pool:
            while not self.stop.is_set():
                pool.submit(once)
                # Until the signal a probe is accepted and waits behind the in-flight work: sent every
                # 20 ms there, so on a slow machine they stay few (the in-flight 6 x 12 sequences plus
                # them stay under the tests' 128-sequence queue: a RESOURCE_EXHAUSTED is not what the
                # drain is tested for) and most of the 64 threads are free to probe after the signal.
                time.sleep(max(self.interval, 0.01) if self.signalled.is_set() else 0.02)
        c.close()

    def join(self) -> None:
        self.stop.set()
        for w in self.workers + self.watchers:
            w.join(30)


def drain(server, *, in_flight: int = 6, sequences_per_request: int = 12, lengths: str = "uniform:32:128",
          seed: int = 2, probe_interval_s: float = 0.005) -> dict:
    """SIGTERM with `in_flight` requests accepted; a health poller and a Score prober run throughout."""
    grace_s = float(server.flags.get("drain_grace_seconds", FLAGS["drain_grace_seconds"]))
    rng = np.random.default_rng([seed, 6])
    reqs = [make_rollout(rng, sequences_per_request, LengthMix.parse(lengths)) for _ in range(in_flight)]
    watch = _DrainWatch(server, reqs, grace_s, probe_interval_s)
    for w in watch.workers:
        w.start()
    _wait_in_flight(server, in_flight)
    for w in watch.watchers:
        w.start()
    time.sleep(0.2)  # the watchers have seen the server serving
    t_sig = time.perf_counter()
    watch.signalled.set()
    server.signal(signal.SIGTERM)
    try:
        code = server.proc.wait(grace_s + 60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        code = server.proc.wait()
    exit_s = time.perf_counter() - t_sig
    watch.join()
    results = watch.results
    return {
        "kind": server.kind, "grace_s": grace_s, "in_flight": in_flight,
        "in_flight_answered_ok": sum(1 for r in results if r and r[0] == "OK" and r[1] == str(sequences_per_request)),
        "in_flight_outcomes": [list(r) if r else None for r in results],
        **_drain_order(watch.health, watch.probes, t_sig, exit_s),
        "exit_code": code, "exit_s": exit_s, "exit_within_grace": exit_s <= grace_s,
        "all_accepted_answered": all(r and r[0] == "OK" for r in results),
    }


def _drain_order(health: list, probes: list, t_sig: float, exit_s: float) -> dict:
    """What the health checks and probes saw after the signal, in order."""
    def rel_ms(t: float | None) -> float | None:
        return None if t is None else (t - t_sig) * 1e3

    first_not_serving = next((a for s, a, ok in health if s >= t_sig and ok is False), None)
    first_refusal = next((a for s, a, c, _ in probes if s >= t_sig and c != "OK"), None)
    # The guarantee, causally: no health check sent after a refusal was received may still say SERVING.
    serving_after_refusal = sum(1 for s, _, ok in health if first_refusal is not None and s > first_refusal and ok)
    refusals: dict[str, int] = {}
    for _, _, c, d in probes:
        if c != "OK":
            key = f"{c}: {d[:40]}" if c != "UNAVAILABLE" or "draining" in d else f"{c} (closed)"
            refusals[key] = refusals.get(key, 0) + 1
    accepted = sum(1 for p in probes if p[2] == "OK")
    # While draining, a refusal is UNAVAILABLE. In the last moment of the process (the gRPC
    # listener's own shutdown, ~1 s) a call can also meet CANCELLED or a reset: counted apart.
    t_exit = t_sig + exit_s
    odd_early = sum(1 for _, a, c, _ in probes if c not in ("OK", "UNAVAILABLE") and a < t_exit - 1.5)
    return {"probes_accepted": accepted, "probes_refused": len(probes) - accepted,
            "refusal_kinds": refusals, "refusals_not_unavailable_before_exit": odd_early,
            "health_checks": len(health),
            "not_serving_seen_ms": rel_ms(first_not_serving), "first_refusal_ms": rel_ms(first_refusal),
            "health_serving_after_refusal": serving_after_refusal,
            "not_serving_first": first_not_serving is not None and serving_after_refusal == 0}


def _wait_in_flight(server, n: int, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if metric(server, "rmscore_requests_in_flight") >= n:
            return
        time.sleep(0.01)
    raise RuntimeError(f"{n} requests never in flight together on {server.kind}")


# ---- cancelled and vanished clients ------------------------------------------------------

async def _cancel_round(server, reqs: list, cancel_after_s: float) -> dict:
    """Every request sent at once; half cancel the call, half drop their whole connection."""
    outcomes: dict[str, int] = {}

    async def grpc_one(i: int, seqs) -> None:
        import grpc

        from rmscore_client.v1 import reward_pb2_grpc

        ch = grpc.aio.insecure_channel(server.target)
        call = reward_pb2_grpc.RewardModelStub(ch).Score(caller.score_request(caller.tokens(seqs)), timeout=120)
        await asyncio.sleep(cancel_after_s)
        if i % 2 == 0:
            call.cancel()
        await ch.close(grace=None)  # the other half vanish: the connection goes, no RST_STREAM first
        try:
            await call
            outcomes["answered"] = outcomes.get("answered", 0) + 1
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            outcomes["gone"] = outcomes.get("gone", 0) + 1

    async def http_one(i: int, seqs) -> None:
        import httpx

        c = httpx.AsyncClient(base_url=server.base_url, timeout=120)
        task = asyncio.create_task(c.post("/rmscore/v1/score", json={"sequences": [{"tokens": s} for s in seqs]}))
        await asyncio.sleep(cancel_after_s)
        done = task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await c.aclose()  # the connection closes: the server sees the client vanish
        outcomes["answered" if done else "gone"] = outcomes.get("answered" if done else "gone", 0) + 1

    one = grpc_one if server.transport == "grpc" else http_one
    await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    return outcomes


def cancel(server, *, rounds: int = 6, clients_per_round: int = 8, sequences_per_request: int = 32,
           lengths: str = "uniform:192:384", cancel_after_s: float = 0.3, seed: int = 3) -> dict:
    """Rounds of clients that go away mid-request: dropped, not scored, and no memory kept per round."""
    rng = np.random.default_rng([seed, 7])
    mix = LengthMix.parse(lengths)
    scored0 = metric(server, "rmscore_sequences_scored_total")
    dropped0 = metric(server, "rmscore_sequences_dropped_total", reason="cancelled")
    refused0 = metric(server, "rmscore_requests_total", code="RESOURCE_EXHAUSTED")
    rss, idle_each, outcomes = [], [], {}

    async def run_rounds() -> None:
        # One event loop for every round: grpc.aio's poller outlives a loop closed under it.
        for _ in range(rounds):
            reqs = [make_rollout(rng, sequences_per_request, mix) for _ in range(clients_per_round)]
            for k, v in (await _cancel_round(server, reqs, cancel_after_s)).items():
                outcomes[k] = outcomes.get(k, 0) + v
            idle_each.append(await asyncio.to_thread(wait_idle, server, 60))
            rss.append(rss_mb(server.proc.pid))

    asyncio.run(run_rounds())
    offered = rounds * clients_per_round * sequences_per_request
    scored = metric(server, "rmscore_sequences_scored_total") - scored0
    dropped = metric(server, "rmscore_sequences_dropped_total", reason="cancelled") - dropped0
    refused = metric(server, "rmscore_requests_total", code="RESOURCE_EXHAUSTED") - refused0
    half = max(1, rounds // 2)
    return {
        "kind": server.kind, "rounds": rounds, "clients_per_round": clients_per_round,
        "offered_sequences": offered, "scored_sequences": scored, "dropped_cancelled": dropped,
        "refused_requests": refused, "scored_fraction": scored / offered, "client_outcomes": outcomes,
        "idle_after_every_round": all(idle_each), "rss_mb": [round(x, 1) for x in rss],
        # First half of the rounds warms allocator pools; growth is judged on the second half.
        "rss_growth_pct": 100.0 * (rss[-1] - rss[half - 1]) / rss[half - 1],
        "golden_after": golden_ok(server),
    }


# ---- steady load and soak ----------------------------------------------------------------

def _steady(server, requests, concurrency: int, seconds: float, on_tick=None, tick_s: float = 1.0) -> dict:
    """A closed loop for `seconds`, every answer counted (no settling)."""
    async def run() -> dict:
        c = caller.async_client(server.transport, caller.target_of(server), chunk_size=len(requests[0]),
                                timeout_s=120)
        try:
            return await loadgen.closed_loop(c, requests, concurrency, seconds, max_settle_s=0, drain_timeout_s=120,
                                             on_tick=on_tick, tick_s=tick_s)
        finally:
            await c.close()
    return asyncio.run(run())


def soak(server, *, seconds: float = 120.0, warmup_s: float = 20.0, sample_every_s: float = 5.0,
         concurrency: int = 4, chunk_size: int = 8, lengths: str = LIGHT_LENGTHS, seed: int = 4,
         progress=None) -> dict:
    """Steady load for warmup_s + seconds; VmRSS sampled every sample_every_s after the warm-up."""
    requests = _requests(lengths, chunk_size, seed, pool=256)
    samples: list[tuple[float, float]] = []  # (seconds since the warm-up ended, RSS MiB)
    pid = server.proc.pid

    def on_tick(t: float, count: dict) -> None:
        if t >= warmup_s and (not samples or t - warmup_s - samples[-1][0] >= sample_every_s - 1e-3):
            samples.append((t - warmup_s, rss_mb(pid)))
        if progress is not None:
            progress(t, warmup_s + seconds, count)

    r = _steady(server, requests, concurrency, warmup_s + seconds, on_tick, tick_s=0.5)
    samples.append((r["settle_s"] + r["window_open_s"] - warmup_s, rss_mb(pid)))
    ts = np.array([s[0] for s in samples])
    mb = np.array([s[1] for s in samples])
    slope = float(np.polyfit(ts, mb, 1)[0]) * 60 if len(samples) >= 2 and np.ptp(ts) > 0 else float("nan")
    return {
        "kind": server.kind, "seconds": seconds, "warmup_s": warmup_s, "concurrency": concurrency,
        "requests": r["requests"], "errors": r["errors"], "error_kinds": r["error_kinds"], "seq_s": r["throughput_seq_s"],
        "latency_ms": r["latency_ms"], "samples": [[round(t, 2), round(m, 2)] for t, m in samples],
        "rss_start_mb": float(mb[0]), "rss_end_mb": float(mb[-1]), "rss_max_mb": float(mb.max()),
        "rss_growth_pct": float(100.0 * (mb[-1] - mb[0]) / mb[0]),
        "rss_slope_mb_per_min": slope,
    }
