"""The CPU side of the GPU path: asking for CUDA where there is none fails at start, clearly,
and never falls back to the CPU (the GPU side itself is scripts/gpu_check.py, docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch

import servers


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: CUDA would start")
@pytest.mark.parametrize("kind,message", [
    ("py-grpc-eager", "--device cuda: PyTorch sees no CUDA device"),
    ("py-grpc-onnxruntime", "--device cuda: this onnxruntime has no CUDAExecutionProvider"),
    ("cpp-grpc", "--device cuda: this ONNX Runtime library has no CUDAExecutionProvider"),
])
def test_cuda_without_a_gpu_fails_at_start(kind, message):
    if kind not in servers.available_kinds():
        pytest.skip(f"{kind} is not built")
    s = servers.start(kind, wait_ready=False, device="cuda")
    try:
        code = s.proc.wait(300)
    finally:
        s.stop(5)
    assert code != 0
    assert message in s.log(), s.log()


@pytest.mark.parametrize("flags,message", [
    (dict(backend="onnxruntime", precision="bf16"), "bf16/fp16 autocast needs --backend eager or compile"),
    (dict(backend="eager", precision="int8"), "int8 needs --backend onnxruntime"),
    (dict(backend="eager", device="tpu"), "--device: must be cpu or cuda, got 'tpu'"),
])
def test_precision_and_device_flags_are_validated(flags, message):
    from rmscore.config import ConfigError, ServeConfig

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ServeConfig(model=servers.MODEL, **flags)
