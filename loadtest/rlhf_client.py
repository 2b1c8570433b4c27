"""Locust: RLHF trainer ranks scoring rollouts against every rmscore server at once.

One user class per server kind; each user is one trainer rank. It builds a
rollout of N sequences (long-tailed prompt+response lengths), scores the whole
rollout through the rmscore client with every chunk in flight together, then
waits its "policy update" time before the next rollout (or, with --rollout-period, starts a
rollout every period: constant pacing, the offered load `rmscore up` sizes). Locust records

* every RPC, as request type `grpc` / `http`, name `<kind> Score`
  (response_length = sequences in the chunk), and
* every rollout, as request type `rollout`, name `<kind> rollout`
  (response time = makespan of the whole rollout, response_length = N).

gRPC users send each chunk with grpc's gevent-cooperative blocking stub (the
rmscore client's gRPC path is grpc.aio, which hangs under gevent's monkey
patching); the FastAPI user goes through rmscore_client's AsyncHttpRewardClient
on an asyncio loop hosted by a greenlet. Same chunks, same contract. The kinds, the caller
and the workload are the tools distribution's (tools/rmscore_tools).

Targets come from the command line or the environment (command line wins):

    --target-cpp        RMSCORE_TARGET_CPP         127.0.0.1:50051   C++ gRPC (ONNX Runtime)
    --target-py-eager   RMSCORE_TARGET_PY_EAGER    127.0.0.1:50052   Python gRPC, PyTorch eager
    --target-py-compile RMSCORE_TARGET_PY_COMPILE  127.0.0.1:50053   Python gRPC, torch.compile
    --target-py-ort     RMSCORE_TARGET_PY_ORT      127.0.0.1:50054   Python gRPC, ONNX Runtime
    --target-http       RMSCORE_TARGET_HTTP        http://127.0.0.1:8000  FastAPI, ONNX Runtime

A target that is empty or `off` removes its user class. Users are split evenly
over the remaining classes, so give `-u` at least the number of classes.

    locust -f loadtest/rlhf_client.py                      # web UI on :8089
    locust -f loadtest/rlhf_client.py --headless -u 5 -r 5 -t 60s \
        --csv out/rlhf --json-file out/rlhf --rollout-size 64 --chunk-size 8
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time

import gevent
import gevent.event
import grpc.experimental.gevent as grpc_gevent
from locust import User, events, task
from locust.exception import StopUser

# Before any channel exists: make grpc's blocking calls cooperate with gevent.
grpc_gevent.init_gevent()

from rmscore_tools.kinds import KINDS  # noqa: E402
from rmscore_tools import caller  # noqa: E402
from rmscore_tools.workload import LengthMix, chunks, make_rollout  # noqa: E402

import numpy as np  # noqa: E402

log = logging.getLogger("rlhf_client")

OFF = ("", "off", "none", "0")

# The registry's kinds by their target option (--target-cpp, env RMSCORE_TARGET_CPP, ...).
TARGETS = {k.locust_option: k for k in KINDS.values()}


def _is_off(value) -> bool:
    return value is None or str(value).strip().lower() in OFF


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    # On the parser itself, not a group: only its add_argument takes locust's web-UI keywords,
    # and every option added here shows in the web UI's custom parameters.
    for option, k in TARGETS.items():
        parser.add_argument("--" + option.replace("_", "-"), env_var=k.locust_env, default=k.default_target,
                            help=f"{k.name} target ({'host:port' if k.transport == 'grpc' else 'base URL'}); "
                                 f"'off' or empty excludes it (env {k.locust_env}, default %(default)s)")
    parser.add_argument("--rollout-size", type=int, env_var="RMSCORE_ROLLOUT_SIZE", default=64,
                        help="sequences per rollout (default %(default)s)")
    parser.add_argument("--chunk-size", type=int, env_var="RMSCORE_CHUNK_SIZE", default=8,
                        help="sequences per RPC; all chunks of a rollout are in flight together "
                             "(default %(default)s)")
    parser.add_argument("--lengths", env_var="RMSCORE_LENGTHS", default="lognormal:160:0.6:32:512",
                        help="length mix: lognormal:MEDIAN:SIGMA:MIN:MAX, uniform:MIN:MAX or fixed:N "
                             "(default %(default)s)")
    parser.add_argument("--update-time", env_var="RMSCORE_UPDATE_TIME", default="1.0",
                        help="policy-update wait after each rollout, seconds: S or MIN-MAX (default %(default)s)")
    parser.add_argument("--rollout-period", env_var="RMSCORE_ROLLOUT_PERIOD", default="",
                        help="constant pacing instead of --update-time: seconds from one rollout's start to the "
                             "next, S for every server or KIND=S,KIND=S per server kind (`rmscore up` sizes "
                             "it from each server's capacity); a kind not named keeps --update-time")
    parser.add_argument("--rpc-timeout", type=float, env_var="RMSCORE_RPC_TIMEOUT", default=120.0,
                        help="per-RPC deadline in seconds (default %(default)s)")
    parser.add_argument("--rollout-seed", type=int, env_var="RMSCORE_ROLLOUT_SEED", default=0,
                        help="base seed of the rollout generator (default %(default)s)")


def _periods(spec: str) -> dict[str, float]:
    """--rollout-period as {kind or "*": seconds}."""
    out = {}
    for part in (p.strip() for p in str(spec or "").split(",") if p.strip()):
        kind, _, value = part.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if seconds <= 0 or (kind and kind not in KINDS):
            raise ValueError(f"--rollout-period: expected S or KIND=S with S > 0 and KIND one of "
                             f"{', '.join(KINDS)}, got {part!r}")
        out[kind or "*"] = seconds
    return out


def _update_range(spec: str) -> tuple[float, float]:
    parts = str(spec).split("-")
    try:
        lo, hi = (float(parts[0]), float(parts[0])) if len(parts) == 1 else (float(parts[0]), float(parts[1]))
    except ValueError:
        raise ValueError(f"--update-time: expected S or MIN-MAX seconds, got {spec!r}") from None
    if lo < 0 or hi < lo:
        raise ValueError(f"--update-time: need 0 <= MIN <= MAX, got {spec!r}")
    return lo, hi


@events.init.add_listener
def _select_user_classes(environment, **_kwargs) -> None:
    """Drop the user class of every server whose target is off; validate the workload options."""
    opts = environment.parsed_options
    if opts is None:  # used as a library (locust.env.Environment without options): keep everything
        return
    LengthMix.parse(opts.lengths)
    _update_range(opts.update_time)
    _periods(opts.rollout_period)
    if opts.rollout_size < 1 or opts.chunk_size < 1:
        raise ValueError(f"--rollout-size and --chunk-size must be >= 1, got {opts.rollout_size}, {opts.chunk_size}")
    keep = [u for u in environment.user_classes if not _is_off(getattr(opts, getattr(u, "target_option", ""), ""))]
    dropped = sorted({u.__name__ for u in environment.user_classes} - {u.__name__ for u in keep})
    if dropped:
        log.info("rmscore: target off, not running %s", ", ".join(dropped))
    if not keep:
        raise SystemExit("rlhf_client: every target is off; set at least one of "
                         + ", ".join("--" + o.replace("_", "-") for o in TARGETS))
    environment.user_classes[:] = keep
    available = getattr(environment, "available_user_classes", None)
    if isinstance(available, dict):
        for name in dropped:
            available.pop(name, None)


class _GreenletLoop:
    """One asyncio event loop per process, run by a greenlet: gevent's patched selectors make it
    cooperative, so the rmscore client's asyncio HTTP client runs inside Locust unchanged."""

    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, make_coro):
        if cls._loop is None:
            cls._loop = asyncio.new_event_loop()
            gevent.spawn(cls._loop.run_forever)
        done = gevent.event.AsyncResult()

        def settle(task: asyncio.Task) -> None:
            if task.cancelled():
                done.set_exception(asyncio.CancelledError())
            elif task.exception() is not None:
                done.set_exception(task.exception())
            else:
                done.set(task.result())

        cls._loop.call_soon_threadsafe(lambda: cls._loop.create_task(make_coro()).add_done_callback(settle))
        return done.get()


class RolloutUser(User):
    """One trainer rank: rollout -> score every chunk concurrently -> policy update -> repeat."""

    abstract = True
    target_option = ""

    def __init__(self, environment):
        super().__init__(environment)
        self.transport, self.label = TARGETS[self.target_option].transport, TARGETS[self.target_option].name
        self.client = None
        self.rng = None

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        k = TARGETS[self.target_option]
        target = getattr(opts, self.target_option, None) if opts else os.environ.get(k.locust_env, k.default_target)
        if _is_off(target):
            raise StopUser()
        self.target = target
        self.rollout_size = getattr(opts, "rollout_size", 64)
        self.chunk_size = getattr(opts, "chunk_size", 8)
        self.mix = LengthMix.parse(getattr(opts, "lengths", "lognormal"))
        self.update = _update_range(getattr(opts, "update_time", "1.0"))
        periods = _periods(getattr(opts, "rollout_period", ""))
        self.period = periods.get(self.label, periods.get("*"))
        self.last_rollout_s = 0.0
        timeout = getattr(opts, "rpc_timeout", 120.0)
        seed = getattr(opts, "rollout_seed", 0)
        self.rng = np.random.default_rng([seed, id(self) & 0xFFFFFFFF, os.getpid()])
        if self.transport == "grpc":
            self.client = caller.GeventGrpcClient(target, timeout_s=timeout)
        else:
            self.client = _GreenletLoop.run(lambda: _make_async(self.transport, target, self.chunk_size, timeout))

    def on_stop(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            if self.transport == "grpc":
                client.close()
            else:
                _GreenletLoop.run(lambda: client.close())

    def wait_time(self) -> float:
        if self.period is not None:  # constant pacing: a slow rollout shortens the wait, never overlaps
            return max(0.0, self.period - self.last_rollout_s)
        lo, hi = self.update
        return lo if hi == lo else random.uniform(lo, hi)

    def _record(self, count: int, ms: float, exc: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type=self.transport, name=f"{self.label} Score", response_time=ms,
            response_length=count, exception=exc, context={"target": self.target})

    def _grpc_chunk(self, chunk: list[list[int]]) -> Exception | None:
        start = time.perf_counter()
        exc = None
        client = self.client
        if client is None:  # on_stop ran between this chunk's spawn and now: the user is stopping
            return None
        try:
            scores = client.score_ids(chunk).scores
            if len(scores) != len(chunk):
                raise RuntimeError(f"{len(scores)} scores for {len(chunk)} sequences")
            if not np.all(np.isfinite(scores)):
                raise RuntimeError(f"non-finite score in {list(scores)}")
        except Exception as e:  # recorded as a failure, never raised: the other chunks go on
            if self.client is None:
                # on_stop closed the channel under it at the run's end ("CANCELLED: Channel
                # closed!"): this run's own doing, not the server's failure, so not recorded.
                return None
            exc = e
        self._record(len(chunk), (time.perf_counter() - start) * 1000.0, exc)
        return exc

    def _score_grpc(self, rollout: list[list[int]]) -> list[Exception]:
        jobs = [gevent.spawn(self._grpc_chunk, c) for c in chunks(rollout, self.chunk_size)]
        gevent.joinall(jobs)
        return [j.value if j.successful() else j.exception for j in jobs if not j.successful() or j.value]

    def _score_async(self, rollout: list[list[int]]) -> list[Exception]:
        """Through rmscore_client: it cuts the chunks and sends them all at once; each answered
        chunk is recorded with the client's own per-chunk latency."""
        answered = []
        start = time.perf_counter()
        # Read the client now, in this greenlet: the coroutine is built later on the loop's thread,
        # by when a stopping run's on_stop may have set self.client to None (an error log that
        # failed the Locust run at its time limit).
        client = self.client
        if client is None:
            return []
        try:
            result = _GreenletLoop.run(lambda: client.score_ids(rollout, on_chunk=answered.append))
            if len(result.scores) != len(rollout) or not np.all(np.isfinite(result.scores)):
                raise RuntimeError(f"{len(result.scores)} scores for {len(rollout)} sequences, or non-finite")
            exc = None
        except Exception as e:
            exc = e
        for t in answered:
            self._record(t.count, t.latency_ms, None)
        if exc is None:
            return []
        # The client stops the rollout at the first failed chunk: one failure, the rest not sent/answered.
        self._record(len(rollout) - sum(t.count for t in answered), (time.perf_counter() - start) * 1000.0, exc)
        return [exc]

    @task
    def score_rollout(self) -> None:
        rollout = make_rollout(self.rng, self.rollout_size, self.mix)
        start = time.perf_counter()
        errors = self._score_grpc(rollout) if self.transport == "grpc" else self._score_async(rollout)
        self.last_rollout_s = time.perf_counter() - start
        n_chunks = -(-len(rollout) // self.chunk_size)
        failure = None
        if errors:
            failure = RuntimeError(f"{len(errors)}/{n_chunks} chunks failed; first: {errors[0]!r}"[:500])
        self.environment.events.request.fire(
            request_type="rollout", name=f"{self.label} rollout",
            response_time=(time.perf_counter() - start) * 1000.0, response_length=len(rollout),
            exception=failure, context={"target": self.target, "chunks": n_chunks})


async def _make_async(transport: str, target: str, chunk_size: int, timeout: float):
    return caller.async_client(transport, target, chunk_size=chunk_size, timeout_s=timeout)


class CppGrpcUser(RolloutUser):
    """C++ gRPC server (ONNX Runtime)."""

    target_option = "target_cpp"


class PyEagerUser(RolloutUser):
    """Python gRPC server, PyTorch eager."""

    target_option = "target_py_eager"


class PyCompileUser(RolloutUser):
    """Python gRPC server, torch.compile."""

    target_option = "target_py_compile"


class PyOrtUser(RolloutUser):
    """Python gRPC server, ONNX Runtime."""

    target_option = "target_py_ort"


class FastApiUser(RolloutUser):
    """FastAPI server, ONNX Runtime (POST /rmscore/v1/score)."""

    target_option = "target_http"

