"""The Locust file (loadtest/rlhf_client.py) as Locust runs it: a headless subprocess with a bounded
run time, against real servers on loopback, read back from its --json-file and --csv output."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

import servers

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "rlhf_client.py"
TARGET_ENV = ("RMSCORE_TARGET_CPP", "RMSCORE_TARGET_PY_EAGER", "RMSCORE_TARGET_PY_COMPILE",
              "RMSCORE_TARGET_PY_ORT", "RMSCORE_TARGET_HTTP")
ROLLOUT, CHUNK = 8, 4


@pytest.fixture(scope="module")
def stack():
    """A Python gRPC (ONNX Runtime) server and the FastAPI server, started side by side."""
    kinds = ["py-grpc-onnxruntime", "py-http-onnxruntime"]
    started = [servers.start(k, wait_ready=False) for k in kinds]
    try:
        for s in started:
            servers.wait_until_ready(s, time.monotonic() + 400)
        yield {s.kind: s for s in started}
    finally:
        for s in started:
            s.stop()


def run_locust(tmp_path: pathlib.Path, args: list[str], env: dict[str, str], run_time: str = "12s",
               users: int = 2, timeout_s: float = 180) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "rlhf"
    base_env = {k: v for k, v in os.environ.items() if k not in TARGET_ENV}
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r", str(users),
           "-t", run_time, "--stop-timeout", "60", "--csv", str(out), "--json-file", str(out), "--only-summary",
           "--rollout-size", str(ROLLOUT), "--chunk-size", str(CHUNK), "--update-time", "0.1", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env={**base_env, **env}, capture_output=True, text=True,
                          timeout=timeout_s)
    stats_path = out.with_name(out.name + ".json")
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else []
    return proc, stats


def by_name(stats: list[dict]) -> dict[tuple[str, str], dict]:
    return {(e["method"], e["name"]): e for e in stats}


def test_headless_against_grpc_and_http_without_failures(stack, tmp_path):
    grpc_srv, http_srv = stack["py-grpc-onnxruntime"], stack["py-http-onnxruntime"]
    # Targets both ways: the gRPC one on the command line, the HTTP one and the "off" ones from the environment.
    env = {"RMSCORE_TARGET_HTTP": http_srv.base_url, "RMSCORE_TARGET_CPP": "off",
           "RMSCORE_TARGET_PY_EAGER": "", "RMSCORE_TARGET_PY_COMPILE": "off"}
    proc, stats = run_locust(tmp_path, ["--target-py-ort", grpc_srv.target], env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "not running CppGrpcUser, PyCompileUser, PyEagerUser" in log
    entries = by_name(stats)
    assert set(entries) == {("grpc", "py-grpc-onnxruntime Score"), ("rollout", "py-grpc-onnxruntime rollout"),
                            ("http", "py-http-onnxruntime Score"), ("rollout", "py-http-onnxruntime rollout")}, log
    for key, e in entries.items():
        assert e["num_failures"] == 0, (key, log)
        assert e["num_requests"] >= 1, key
    for label in ("py-grpc-onnxruntime", "py-http-onnxruntime"):
        rpcs = [e for (m, n), e in entries.items() if n == f"{label} Score"][0]
        rollouts = entries[("rollout", f"{label} rollout")]
        # response_length: sequences per rollout, and per RPC (every rollout is ROLLOUT/CHUNK chunks;
        # --stop-timeout lets rollouts in flight finish, so every started rollout is complete).
        assert rollouts["total_content_length"] == ROLLOUT * rollouts["num_requests"]
        assert rpcs["num_requests"] == rollouts["num_requests"] * (ROLLOUT // CHUNK)
        assert rpcs["total_content_length"] == ROLLOUT * rollouts["num_requests"]
        # A rollout's makespan covers its slowest chunk.
        assert rollouts["max_response_time"] >= rpcs["min_response_time"]
    csv = (tmp_path / "rlhf_stats.csv").read_text()
    assert "py-grpc-onnxruntime rollout" in csv and "py-http-onnxruntime Score" in csv


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failures_are_recorded_and_fail_the_run(tmp_path):
    port = _dead_port()
    env = {"RMSCORE_TARGET_CPP": "off", "RMSCORE_TARGET_PY_EAGER": "off", "RMSCORE_TARGET_PY_COMPILE": "off",
           "RMSCORE_TARGET_HTTP": "off", "RMSCORE_TARGET_PY_ORT": f"127.0.0.1:{port}"}
    proc, stats = run_locust(tmp_path, ["--rpc-timeout", "2"], env, run_time="3s", users=1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    entries = by_name(stats)
    assert entries[("grpc", "py-grpc-onnxruntime Score")]["num_failures"] >= 1
    assert entries[("rollout", "py-grpc-onnxruntime rollout")]["num_failures"] >= 1


def test_every_target_off_is_refused(tmp_path):
    env = {k: "off" for k in TARGET_ENV}
    proc, stats = run_locust(tmp_path, [], env, run_time="3s", users=1, timeout_s=60)
    assert proc.returncode != 0
    assert "every target is off" in proc.stdout + proc.stderr
    assert stats == []
