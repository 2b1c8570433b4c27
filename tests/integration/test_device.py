"""The CPU side of the GPU path: asking for CUDA where there is none fails at start, clearly,
and never falls back to the CPU; the GPU check (tools/rmscore_tools/bench/gpu_check.py) says so
too, and on a machine that lacks some packages reports those parts unavailable instead of
crashing (docs/gpu.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import servers

GPU_CHECK = servers.ROOT / "tools" / "rmscore_tools" / "bench" / "gpu_check.py"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: CUDA would start")

TORCH_NO_CUDA = "--device cuda: PyTorch sees no CUDA device"
ORT_NO_CUDA = "--device cuda: this onnxruntime has no CUDAExecutionProvider"


@no_gpu
@pytest.mark.parametrize("kind,message", [
    ("py-grpc-eager", TORCH_NO_CUDA),
    # The check comes before torch.compile is even set up: a refused start costs no warm-up.
    ("py-grpc-compile", TORCH_NO_CUDA),
    ("py-grpc-onnxruntime", ORT_NO_CUDA),
    ("py-http-onnxruntime", ORT_NO_CUDA),
    ("cpp-grpc", "--device cuda: this ONNX Runtime library has no CUDAExecutionProvider"),
])
def test_cuda_without_a_gpu_fails_at_start(kind, message):
    if kind not in servers.available_kinds():
        pytest.skip(f"{kind} is not built")
    t0 = time.monotonic()
    s = servers.start(kind, wait_ready=False, device="cuda")
    try:
        code = s.proc.wait(300)
    finally:
        s.stop(5)
    assert code != 0
    assert message in s.log(), s.log()
    assert "warm-up" not in s.log(), s.log()
    # Generous for a loaded 2-core machine; a compile warm-up alone takes over a minute here.
    assert time.monotonic() - t0 < 60, s.log()


@pytest.mark.parametrize("flags,message", [
    (dict(backend="onnxruntime", precision="bf16"), "bf16/fp16 autocast needs --backend eager or compile"),
    (dict(backend="eager", precision="int8"), "int8 needs --backend onnxruntime"),
    (dict(backend="eager", device="tpu"), "--device: must be cpu or cuda, got 'tpu'"),
])
def test_precision_and_device_flags_are_validated(flags, message):
    from rmscore.core.config import ConfigError, ServeConfig

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ServeConfig(model=servers.MODEL, **flags)


# Runs gpu_check as on a bare GPU machine: these top-level packages cannot be imported, as
# if only torch, numpy and onnxruntime were installed (the carry not unpacked).
BARE = """
import runpy, sys
BLOCKED = {"grpc", "grpc_health", "grpc_reflection", "httpx", "fastapi", "uvicorn", "pydantic", "starlette",
           "prometheus_client", "transformers", "safetensors", "tokenizers", "yaml", "huggingface_hub"}
class Bare:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Bare())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def gpu_check(tmp_path, *args, bare: bool = False, timeout_s: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", BARE] if bare else [sys.executable]
    return subprocess.run([*cmd, str(GPU_CHECK), "--out", str(tmp_path / "report.md"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@no_gpu
@pytest.mark.parametrize("bare", [False, True], ids=["venv", "bare"])
def test_gpu_check_without_cuda_exits_with_the_reason(tmp_path, bare):
    t0 = time.monotonic()
    r = gpu_check(tmp_path, bare=bare)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"gpu_check: {TORCH_NO_CUDA}" in r.stderr, r.stderr
    assert "--device cpu for a dry run" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "report.md").exists()
    assert time.monotonic() - t0 < 60


def test_gpu_check_on_a_bare_machine_reports_missing_parts(tmp_path):
    """The dry run (--device cpu) with only torch, numpy and onnxruntime: the ONNX Runtime row is
    measured; the PyTorch rows and the servers say which packages they lack."""
    r = gpu_check(tmp_path, "--device", "cpu", "--runtimes", "onnxruntime:fp32,eager:fp32", "--batches", "1,2",
                  "--seconds", "0.2", "--servers", "py-grpc-onnxruntime,cpp-grpc", bare=True)
    assert r.returncode == 0, r.stdout + r.stderr
    report = (tmp_path / "report.md").read_text()
    ort_row = next(line for line in report.splitlines() if line.startswith("| onnxruntime | fp32 |"))
    cells = [c.strip() for c in ort_row.strip("|").split("|")]
    assert float(cells[2]) <= 1e-5, ort_row  # against the manifest's golden eager-fp32 scores
    assert all(c.endswith("x)") and float(c.split()[0]) > 0 for c in cells[3:]), ort_row
    assert "| eager | fp32 | unavailable: missing Python packages: transformers, safetensors |" in report, report
    assert "| py-grpc-onnxruntime | unavailable: No module named 'grpc' | |" in report, report
    assert "| cpp-grpc | unavailable: No module named 'grpc' | |" in report, report


def test_gpu_check_dry_run_measures_servers(tmp_path):
    """The whole pipeline without a GPU: parity, throughput, and a server on ephemeral ports (the
    cheapest kind selected: the launch path is shared by all, and CI time is not)."""
    kinds = [k for k in ("cpp-grpc", "py-grpc-onnxruntime") if k in servers.available_kinds()][:1]
    if not kinds:
        pytest.skip("no cheap server kind selected")
    r = gpu_check(tmp_path, "--device", "cpu", "--runtimes", "onnxruntime:fp32", "--batches", "1",
                  "--seconds", "0.2", "--servers", ",".join(kinds), "--server-seconds", "2", "--clients", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    report = (tmp_path / "report.md").read_text()
    for kind in kinds:
        row = next(line for line in report.splitlines() if line.startswith(f"| {kind} |"))
        assert float(row.split("|")[2]) > 0, report


def test_gpu_carry_rebuilds_the_fused_graph_from_the_hf_weights():
    """The carry holds the weights once (fp16 safetensors); the device rebuilds model.onnx.data from
    them. Every initializer of the served graph must be restorable byte for byte from the fp32 weights,
    else a re-export that folds weights (a scaled Q, say) would break the carry."""
    import importlib.util

    import numpy as np
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    spec = importlib.util.spec_from_file_location("gpu_carry", servers.ROOT / "scripts" / "gpu_carry.py")
    gpu_carry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_carry)
    weights = load_file(str(servers.MODEL / "hf" / "model.safetensors"))
    graph, recipe = gpu_carry.recipe_for(servers.MODEL / "model.onnx", weights)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data for t in graph.graph.initializer)
    assert len(graph.SerializeToString()) < 1_000_000  # the graph itself is small; the weights are not in it
    assert sum(len(r.get("raw", "")) for r in recipe) < 65536  # nothing big carried twice
    data = gpu_carry.build_data(recipe, weights)
    by_name = {r["name"]: r for r in recipe}
    for t in onnx.load(str(servers.MODEL / "model.onnx")).graph.initializer:
        r = by_name[t.name]
        assert data[r["offset"]:r["offset"] + r["length"]] == numpy_helper.to_array(t).tobytes(), t.name
    # And from the fp16-rounded weights the device sees, a different but consistent graph.
    rounded = {k: v.astype(np.float16) for k, v in weights.items()}
    assert gpu_carry.build_data(recipe, rounded) != data
