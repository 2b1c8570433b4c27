"""--cost-profile on a real Python ONNX Runtime server: measured once and saved, loaded on a
restart without measuring again, and refused (the server does not start) when it was measured for
another thread count or is corrupt. Small budgets keep it to seconds."""

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import servers
from rmscore.core.config import ELASTIC_WORKERS
from rmscore_tools.caller import Caller

# The C++ server's side (and profiles crossing languages) is test_cost_profile_cpp.py.
KINDS = [k for k in ("py-grpc-onnxruntime",) if k in servers.available_kinds()]
FLAGS = {"batching": "cost_aware", "cost_profile_seconds": 1}


def load_from_four_callers(server) -> None:
    """Requests of 4 callers at once: batches run on the workers' sessions, which refine the table (a
    lone batch on every thread does not)."""
    def calls(_):
        caller = Caller.to(server)
        return [len(caller.score_ids([[101] + [2000 + i] * 30 + [102]] * 2).scores) for i in range(6)]
    with ThreadPoolExecutor(4) as pool:
        assert all(n == 2 for got in pool.map(calls, range(4)) for n in got)


def refused(kind, **flags) -> str:
    """The server's output when it refuses to start; fails the test if it started."""
    cmd = servers.command(kind, port=0, metrics_port=0, **FLAGS, **flags)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=servers.ROOT)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_profile_is_measured_saved_reused_and_refused_when_it_does_not_match(kind, tmp_path):
    path = tmp_path / "cost.json"
    server = servers.start(kind, cost_profile=path, **FLAGS)
    try:
        assert "cost profile saved" in server.log()
        assert len(Caller.to(server).score_ids([[101, 2000, 102]] * 3).scores) == 3
    finally:
        server.stop()
    doc = json.loads(path.read_text())
    assert doc["identity"]["intra_op_threads"] == 1 and doc["identity"]["model_workers"] == ELASTIC_WORKERS
    assert len(doc["table"]["cost_us"]) == len(doc["table"]["batch_sizes"])

    again = servers.start(kind, cost_profile=path, **FLAGS)
    try:
        assert f"cost profile loaded from {path}" in again.log() and "shapes in" not in again.log()
    finally:
        again.stop()

    out = refused(kind, cost_profile=path, intra_op_threads=2)
    assert "measured for intra_op_threads=1, but this server runs intra_op_threads=2" in out
    path.write_text(path.read_text()[:100])  # cut short: not JSON any more
    assert "cannot read a cost profile" in refused(kind, cost_profile=path)


def test_the_profile_command_measures_saves_shows_and_refuses(tmp_path):
    import sys

    path, png = tmp_path / "cost.json", tmp_path / "cost.png"

    def profile(*extra):
        cmd = [sys.executable, "-m", "rmscore.cli", "profile", "--model", str(servers.MODEL), "--intra-op-threads", "1",
               "--max-batch-size", "8", "--cost-profile-seconds", "1", "--cost-profile", str(path), "--out", str(png),
               *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=servers.ROOT)

    first = profile()
    assert first.returncode == 0, first.stderr[-2000:]
    assert "model ms per sequence" in first.stdout and "saved to" in first.stdout
    assert png.stat().st_size > 10_000  # a drawn plot, not an empty canvas
    again = profile()
    assert again.returncode == 0 and f"loaded from {path}" in again.stdout
    wrong = profile("--backend", "eager")
    assert wrong.returncode == 2 and "measured for backend='onnxruntime'" in wrong.stderr


@pytest.mark.parametrize("kind", [k for k in ("py-grpc-onnxruntime", "cpp-grpc") if k in servers.available_kinds()])
def test_the_default_caches_its_profile_and_measures_again_when_it_does_not_match(kind, tmp_path):
    """Without --cost-profile (and without --batching: cost_aware is the default) the table is cached per
    machine: measured at the first start, loaded at the next; one for another CPU or a corrupt one is not
    used, the log says why, and it is measured again and replaced."""
    from rmscore.core import cost_profile

    def start(refine: bool = False) -> str:
        server = servers.start(kind, cost_profile_dir=tmp_path, cost_profile_seconds=1)
        try:
            assert len(Caller.to(server).score_ids([[101, 2000, 102]] * 2).scores) == 2
            if refine:
                load_from_four_callers(server)  # the server keeps the refined table once idle
                deadline, cached = time.monotonic() + 10, next(tmp_path.glob("*.json"))
                while "refined_batches" not in cached.read_text():
                    assert time.monotonic() < deadline, "the refined table was not kept within 10 s of the load"
                    time.sleep(0.2)
            return server.log()
        finally:
            assert server.stop() == 0

    log = start(refine=True)
    [path] = tmp_path.glob("*.json")
    assert f"none cached at {path}: measuring" in log and f"cost profile saved to {path}" in log
    doc = json.loads(path.read_text())
    assert doc["identity"]["cpu"] == cost_profile.cpu_model() != "unknown"
    # The batches served refined the table, kept for the next start with its measurement.
    assert doc["refined_batches"] >= 1 and doc["measured_at"] and doc["refined_at"] >= doc["measured_at"]
    # Its runs work on their thread alone (elastic's 1-thread workers): timed by that thread's CPU time.
    assert doc["timing"] == "thread-cpu"

    # Refined before profiles said how they were timed: by the wall clock, other processes' load in it.
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != "timing"}))
    log = start()
    assert (f"not used: cached cost profile {path}: refined by the wall clock before profiles said how they "
            f"were timed") in log and "shapes in" in log and f"cost profile saved to {path}" in log
    doc = json.loads(path.read_text())
    assert doc["timing"] == "thread-cpu"

    doc["identity"]["cpu"] = "Another CPU"
    path.write_text(json.dumps(doc))
    log = start()
    assert (f"not used: cached cost profile {path}: measured for cpu='Another CPU', but this server runs "
            f"cpu={cost_profile.cpu_model()!r}; measuring again") in log
    assert "shapes in" in log and f"cost profile saved to {path}" in log

    # A corrupt cache file is replaced the same way (unit-tested in both languages: load_cached, LoadCached).
    log = start()
    assert f"cost profile loaded from {path}" in log and "shapes in" not in log


@pytest.mark.parametrize("kind", [k for k in ("py-grpc-onnxruntime", "cpp-grpc") if k in servers.available_kinds()])
def test_a_server_stopped_straight_after_load_keeps_its_refined_table(kind, tmp_path):
    """A server loaded until it is stopped never has the idle second that writes the refined table back
    (`rmscore bench` and a trainer's last rollout stop it so): the stop writes it."""
    server = servers.start(kind, cost_profile_dir=tmp_path, cost_profile_seconds=1)
    try:
        load_from_four_callers(server)
        [path] = tmp_path.glob("*.json")
        assert "refined_batches" not in path.read_text()  # no idle second yet
    finally:
        assert server.stop() == 0
    doc = json.loads(path.read_text())
    assert doc["refined_batches"] >= 1 and doc["refined_at"] >= doc["measured_at"], server.log()[-2000:]
