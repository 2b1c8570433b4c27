"""The C++ server and the Python servers share one cost-profile format (core/cost_profile.py,
server_cpp/src/cost_profile.cc): a profile the Python ONNX Runtime server wrote loads in the C++
server when the identities match, one the C++ server measured loads in Python, and a profile for
another thread count or a corrupt file refuses to start (exit code 2, before the model loads)."""

from __future__ import annotations

import subprocess

import pytest

import servers
from rmscore.core import cost_profile
from rmscore.core.config import ELASTIC_WORKERS
from rmscore.core.cost import CostTable
from rmscore.model.repository import load_repo

pytestmark = pytest.mark.skipif(not servers.CPP_BINARY.exists(), reason="C++ server not built")
THREADS = servers.TEST_FLAGS["intra_op_threads"]


def identity(threads: int = THREADS) -> dict:
    """What the Python ONNX Runtime server writes for the default model on CPU in fp32."""
    repo = load_repo(servers.MODEL)
    known = {"model": repo.name, "model_version": repo.version, "backend": "onnxruntime", "device": "cpu",
             "precision": "fp32", "intra_op_threads": threads, "model_workers": ELASTIC_WORKERS, "cpu": cost_profile.cpu_model()}
    return {key: known[key] for key in cost_profile.IDENTITY_KEYS}


def refused(profile) -> subprocess.CompletedProcess:
    cmd = servers.command("cpp-grpc", port=0, metrics_port=0, batching="cost_aware", cost_profile=profile)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=servers.ROOT)


def test_profile_for_other_threads_refuses_to_start(tmp_path):
    path = tmp_path / "profile.json"
    cost_profile.save(path, CostTable.make([1], [16], [[100]]), identity(THREADS + 3), 1.0)
    r = refused(path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"--cost-profile {path}: measured for intra_op_threads={THREADS + 3}, but this server runs "
            f"intra_op_threads={THREADS}; remove the file (or name another) to measure again") in r.stderr
    assert "rmscore listening" not in r.stdout  # refused before anything was served


def test_corrupt_profile_refuses_to_start(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"format": "rmscore-cost-profile/1", "identity": {')
    r = refused(path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--cost-profile {path}: cannot read a cost profile: " in r.stderr


def test_profiles_load_across_languages(tmp_path):
    # C++ -> Python: the C++ server measures (within a short budget) and saves; Python loads it.
    measured = tmp_path / "cpp.json"
    server = servers.start("cpp-grpc", batching="cost_aware", cost_profile=measured, cost_profile_seconds=0.5)
    try:
        assert "cost profile saved to" in server.log()
    finally:
        assert server.stop() == 0
    table, workers = cost_profile.load(measured, identity())
    assert workers == ELASTIC_WORKERS and table.batch_sizes[0] == 1 and table.cost_us[0][0] >= 1
    # Python -> C++: a profile Python wrote (a distinctive table) is loaded, not measured again.
    written = tmp_path / "py.json"
    table = CostTable.make([1, 2], [16, 512], [[100, 200], [300, 500]])
    cost_profile.save(written, table, identity(), 1.0)
    server = servers.start("cpp-grpc", batching="cost_aware", cost_profile=written)
    try:
        log = server.log()
        assert f"cost profile loaded from {written}" in log
        assert "shapes in" not in log  # nothing measured
        assert cost_profile.describe(table) in log  # the table it plans with, printed as Python prints it
    finally:
        assert server.stop() == 0
