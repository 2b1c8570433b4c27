"""The client distribution as a trainer installs it: built from a clean copy of client/ and proto/
(no generated stubs lying around), into a fresh virtual environment without torch, then scoring
the golden inputs against a real server. Needs PyPI for the build's and the install's packages,
as any `pip install` does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import servers
from harness import GOLDEN_IDS, GOLDEN_SCORES

# What the server distribution needs and a training environment must keep its own version of.
SERVER_ONLY = {"torch", "onnxruntime", "onnxruntime-gpu", "transformers", "onnx", "locust", "matplotlib", "fastapi"}


def pip(python, *args, cwd=None) -> subprocess.CompletedProcess:
    p = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                       text=True, timeout=900, cwd=cwd)
    assert p.returncode == 0, f"pip {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    src = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(["git", "ls-files", "client", "proto"], cwd=servers.ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(servers.ROOT / name, src / name)
    assert not (src / "client/rmscore_client/v1").exists()  # the build must make the stubs itself
    out = tmp_path_factory.mktemp("dist")
    pip(sys.executable, "wheel", "--no-deps", "-w", str(out), str(src / "client"))
    (whl,) = out.glob("rmscore_client-*.whl")
    return whl


def test_wheel_carries_the_stubs_and_no_server_dependency(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert {"rmscore_client/v1/reward_pb2.py", "rmscore_client/v1/reward_pb2_grpc.py"} <= names
    requires = {line.split(":", 1)[1].strip().split(";")[0] for line in meta.splitlines()
                if line.startswith("Requires-Dist:")}
    names_required = {r.replace(" ", "").split("<")[0].split(">")[0].split("=")[0].split("[")[0].lower()
                      for r in requires}
    assert not names_required & SERVER_ONLY, requires
    assert {"grpcio", "protobuf", "aiohttp"} <= names_required


def test_installs_without_torch_and_scores(wheel, tmp_path):
    venv = tmp_path / "trainer-env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip(python, "install", "-q", str(wheel))
    freeze = pip(python, "freeze").stdout.lower()
    assert not [line for line in freeze.splitlines() if line.split("==")[0] in SERVER_ONLY], freeze
    server = servers.start("py-grpc-onnxruntime")
    try:
        script = (
            "import json, sys\n"
            "import importlib.util\n"
            "assert importlib.util.find_spec('torch') is None, 'torch was pulled in'\n"
            "from rmscore_client import RewardClient\n"
            "with RewardClient(sys.argv[1]) as c:\n"
            "    print(json.dumps(c.score_ids(json.loads(sys.argv[2])).scores))\n")
        p = subprocess.run([str(python), "-c", script, server.target, json.dumps(GOLDEN_IDS)], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        np.testing.assert_allclose(json.loads(p.stdout), GOLDEN_SCORES, atol=1e-4)
    finally:
        server.stop()
