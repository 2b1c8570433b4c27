"""The Python ONNX Runtime kinds serve where torch cannot be imported: a `torch` package that raises
ImportError comes first on the server's PYTHONPATH. The batcher used to take its padding helper
from model/modeling.py, which imports torch, so these kinds loaded it (about 180 MiB resident and
a second of start-up here) for a numpy function."""

from __future__ import annotations

import os

import numpy as np
import pytest

import servers
from harness import GOLDEN_IDS, GOLDEN_SCORES
from rmscore_tools.caller import Caller

KINDS = [k for k in ("py-grpc-onnxruntime", "py-http-onnxruntime") if k in servers.available_kinds()]


@pytest.mark.parametrize("kind", KINDS)
def test_onnxruntime_kind_serves_without_torch(kind, tmp_path):
    blocker = tmp_path / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text('raise ImportError("torch is not installed here (test_without_torch)")\n')
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    server = servers.start(kind, env={"PYTHONPATH": path})
    try:
        scores = np.array(Caller.to(server).score_ids(GOLDEN_IDS).scores)
        assert np.abs(scores - GOLDEN_SCORES).max() <= 1e-5
        assert not any("libtorch" in line for line in open(f"/proc/{server.proc.pid}/maps"))
    finally:
        server.stop()
