"""Warm-up, on every kind (docs/contract.md, "Health and readiness"): from the moment the port file
appears until the model is warm and self-checked, health says NOT_SERVING and Score is refused with
UNAVAILABLE / 503 `not ready: warming up`; then SERVING, and the scores are the golden ones.

A default warm-up takes well under a second on the ONNX Runtime kinds, less than a test's first poll
can be sure to catch, so each kind starts with `--warmup-rounds` sized to take several seconds here
(the compile kind's single round compiles for a minute anyway). A kind that is ready before the
first poll fails the test: it cannot have been observed warming up.
"""

from __future__ import annotations

import signal
import subprocess
import time

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

import servers
from harness import GOLDEN_IDS, GOLDEN_SCORES, CallError, Caller

# A round of the ONNX Runtime set (1x8 and 8x64) takes ~0.15 s on one idle core here (~0.8 s when 4
# test runs share the 2 cores), the PyTorch set (up to 8x128) about twice that: every kind stays
# warming up for 4 s or more, more than a hundred 20 ms polls even on a machine a few times faster.
WARMUP_ROUNDS = {"cpp-grpc": 30, "py-grpc-onnxruntime": 30, "py-http-onnxruntime": 30,
                 "py-grpc-eager": 15, "py-grpc-compile": 1}
KINDS = servers.available_kinds()
WARMING_UP = "not ready: warming up"
SERVICES = ("", "rmscore.v1.RewardModel")
FIRST_ANSWER_WITHIN_S = 30
# SIGTERM to exit while warming up: a model load under way (seconds) cannot be interrupted.
EXIT_WITHIN_S = 30


class Health(servers.HealthProbe):
    """Readiness as the kind's own probe reports it: gRPC Health.Check (both names), or HTTP /readyz."""

    def status(self) -> str | None:
        """"SERVING" / "NOT_SERVING", or None while nothing answers yet (HTTP: uvicorn binds the
        socket before the port file and listens just after)."""
        if self.server.transport == "grpc":
            try:
                got = {self.stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=5).status for s in SERVICES}
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    return None
                raise
            assert len(got) == 1, f"the two service names disagree: {got}"
            return health_pb2.HealthCheckResponse.ServingStatus.Name(got.pop())
        try:
            ready = self.http.get("/readyz")
            alive = self.http.get("/healthz")
        except httpx.ConnectError:
            return None
        assert alive.status_code == 200, alive.text  # alive while warming up: the process runs
        assert ready.status_code in (200, 503), ready.text
        return "SERVING" if ready.status_code == 200 else "NOT_SERVING"

    def live(self) -> str:
        """Liveness (docs/contract.md): gRPC health "liveness", or HTTP /livez. Not readiness: a server
        warming up or draining is alive."""
        if self.server.transport == "grpc":
            return self.check("liveness")
        return "SERVING" if self.http.get("/livez").status_code == 200 else "NOT_SERVING"


def first_answer(health: Health, server: servers.RunningServer) -> str:
    deadline = time.monotonic() + FIRST_ANSWER_WITHIN_S
    while (status := health.status()) is None:
        assert server.proc.poll() is None, f"{server.kind} exited:\n{server.log()}"
        assert time.monotonic() < deadline, f"{server.kind}: health never answered:\n{server.log()}"
        time.sleep(0.02)
    return status


def refusal(server: servers.RunningServer, caller: Caller) -> tuple[str, str, int | None]:
    """(code, message, HTTP status) of a Score call made now."""
    if server.transport == "http":
        r = httpx.post(f"{server.base_url}/rmscore/v1/score", json={"sequences": [{"tokens": GOLDEN_IDS[0]}]}, timeout=30)
        err = r.json().get("error", {}) if r.status_code != 200 else {}
        return err.get("code", "OK"), err.get("message", ""), r.status_code
    try:
        caller.score([{"tokens": GOLDEN_IDS[0]}], timeout_s=30)
    except CallError as e:
        return e.code, e.message, None
    return "OK", "", None


@pytest.mark.parametrize("kind", KINDS)
def test_not_serving_and_refusing_until_warm_then_serving(kind):
    t0 = time.monotonic()
    server = servers.start(kind, wait_ready=False, warmup_rounds=WARMUP_ROUNDS[kind])
    health, caller = Health(server), Caller(server)
    try:
        assert first_answer(health, server) == "NOT_SERVING", \
            f"{kind} was SERVING at the first poll: warm-up too short to observe; raise WARMUP_ROUNDS"
        code, message, http_status = refusal(server, caller)
        assert (code, message) == ("UNAVAILABLE", WARMING_UP), (code, message)
        if http_status is not None:
            assert http_status == 503
        assert health.live() == "SERVING"  # not ready, but alive: a warm-up is no hang
        # Still warming up after the refusal: the calls above cannot have raced the end of warm-up.
        assert health.status() == "NOT_SERVING"
        t_refused = time.monotonic()

        servers.wait_until_ready(server, t0 + 400)
        assert health.status() == "SERVING"
        scores = caller.score([{"tokens": ids} for ids in GOLDEN_IDS], timeout_s=60)
        np.testing.assert_allclose(scores, GOLDEN_SCORES, atol=1e-4 if "compile" in kind else 1e-5, rtol=0)
        print(f"{kind}: warming up for >= {t_refused - t0:.1f} s after start, ready after "
              f"{time.monotonic() - t0:.1f} s")
    finally:
        health.close()
        caller.close()
        assert server.stop() == 0, server.log()


@pytest.mark.parametrize("kind", [k for k in ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime")
                                  if k in KINDS])
def test_bad_warmup_rounds_exits_quoting_it(kind):
    p = subprocess.run(servers.command(kind, port=0, warmup_rounds=0), capture_output=True, text=True, timeout=120,
                       cwd=servers.ROOT)
    assert p.returncode == 2 and "--warmup-rounds: must be >= 1, got 0" in p.stdout + p.stderr, p.stdout + p.stderr


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "py-grpc-compile"])  # one compile start in this file
def test_sigterm_during_warmup_exits_without_ever_serving(kind):
    """A long warm-up must not hold up a shutdown, nor flash SERVING on its way out. 2000 rounds take
    minutes on any machine: a server that finishes its warm-up first cannot exit in time."""
    server = servers.start(kind, wait_ready=False, warmup_rounds=2000)
    health = Health(server)
    try:
        assert first_answer(health, server) == "NOT_SERVING", f"{kind}: ready before the first poll"
        t_term = time.monotonic()
        server.signal(signal.SIGTERM)
        seen, live = set(), set()
        while server.proc.poll() is None and time.monotonic() - t_term < EXIT_WITHIN_S:
            try:
                seen.add(health.status())
                live.add(health.live())
            except (grpc.RpcError, httpx.HTTPError):
                pass  # shutting down mid-call
            time.sleep(0.05)
        exit_s = time.monotonic() - t_term
        assert server.proc.poll() == 0, f"{kind}: exit {server.proc.poll()} {exit_s:.1f} s after SIGTERM:\n{server.log()}"
        assert "SERVING" not in seen, f"{kind}: said SERVING after SIGTERM during warm-up"
        assert "NOT_SERVING" not in live, f"{kind}: liveness failed while draining: a drain is no hang"
        print(f"{kind}: exited {exit_s:.1f} s after SIGTERM during warm-up")
    finally:
        health.close()
        server.stop(5)
