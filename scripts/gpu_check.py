#!/usr/bin/env python3
"""The GPU check (docs/gpu.md): parity of each CUDA runtime against fp32 eager, then throughput.

Runs in a few minutes on a machine with a CUDA GPU, PyTorch and an ONNX Runtime:
1. parity on the manifest's golden inputs: PyTorch eager on CUDA in fp32, bf16 and
   fp16 autocast, torch.compile on CUDA, and ONNX Runtime's CUDA execution provider
   when onnxruntime-gpu is installed, each against the golden eager-fp32 CPU scores;
2. in-process throughput at batch sizes 1..256 (length 128), as ratios to eager fp32;
3. the Python gRPC server at saturation on CUDA for each backend whose dependencies
   are present (closed loop, 16 concurrent requests of 32 sequences, fixed time).
Prints one markdown table per part and writes them to --out.

    python scripts/gpu_check.py --model models/default --out gpu_report.md
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "server_py"))

from rmscore import backends, launch  # noqa: E402
from rmscore.config import ServeConfig  # noqa: E402
from rmscore.model_repo import load_repo  # noqa: E402
from rmscore.modeling import pad_batch  # noqa: E402

RUNTIMES = [("eager", "fp32"), ("eager", "bf16"), ("eager", "fp16"), ("compile", "fp32"), ("onnxruntime", "fp32")]


def make(repo, model: pathlib.Path, backend: str, precision: str):
    cfg = ServeConfig(model=model, backend=backend, precision=precision, device="cuda", intra_op_threads=4)
    be = backends.create(cfg, repo)
    be.warmup(256, repo.max_sequence_length)
    return be


def parity(repo, be) -> float:
    seqs, golden = repo.golden()
    got = np.array([be.score(*pad_batch([s], repo.pad_token_id))[0] for s in seqs])
    return float(np.abs(got - np.array(golden)).max())


def throughput(be, batch: int, length: int = 128, seconds: float = 3.0) -> float:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    be.score(ids, mask)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        be.score(ids, mask)  # returns numpy: the device work is synchronised
        n += batch
    return n / (time.perf_counter() - t0)


def serve_saturation(kind: str, backend: str, model: pathlib.Path, seconds: float = 15.0) -> float:
    import grpc

    from rmscore.v1 import reward_pb2 as pb, reward_pb2_grpc as pbg

    port = 50900
    proc = __import__("subprocess").Popen(launch.command(kind, model=model, device="cuda", port=port,
                                                         metrics_port=0, max_batch_size=256,
                                                         max_batch_tokens=65536), cwd=ROOT)
    try:
        launch.wait_ready(kind, port, proc, time.monotonic() + 600)
        rng = np.random.default_rng(1)
        req = pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=rng.integers(1000, 20000, 128).tolist()))
                                         for _ in range(32)])
        stub = pbg.RewardModelStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        end = time.monotonic() + seconds

        def loop(_):
            n = 0
            while time.monotonic() < end:
                n += len(stub.Score(req, timeout=60).scores)
            return n

        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(16) as pool:
            total = sum(pool.map(loop, range(16)))
        return total / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/default"))
    ap.add_argument("--out", default="gpu_report.md")
    ap.add_argument("--batches", default="1,4,16,64,256")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to PyTorch; nothing to check")
        return 2
    model = pathlib.Path(a.model)
    repo = load_repo(model)
    lines = [f"# GPU check: {torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}",
             "", "| runtime | precision | max abs diff vs eager fp32 (CPU golden) | " +
             " | ".join(f"B={b} seq/s" for b in a.batches.split(",")) + " |",
             "|---|---|---|" + "---|" * len(a.batches.split(","))]
    base = None
    for backend, precision in RUNTIMES:
        try:
            be = make(repo, model, backend, precision)
        except Exception as e:  # noqa: BLE001 - a runtime missing here is reported, not fatal
            lines.append(f"| {backend} | {precision} | unavailable: {str(e)[:80]} |")
            print(lines[-1], flush=True)
            continue
        diff = parity(repo, be)
        tput = [throughput(be, int(b)) for b in a.batches.split(",")]
        base = base or tput
        cells = " | ".join(f"{t:.0f} ({t / b0:.2f}x)" for t, b0 in zip(tput, base))
        lines.append(f"| {backend} | {precision} | {diff:.2e} | {cells} |")
        print(lines[-1], flush=True)
        del be
        torch.cuda.empty_cache()
    lines += ["", "| server | backend | seq/s at saturation (16 x 32 x 128 tokens) |", "|---|---|---|"]
    for backend in ("onnxruntime", "eager", "compile"):
        try:
            lines.append(f"| py-grpc | {backend} | {serve_saturation('py-grpc-' + backend, backend, model):.0f} |")
        except Exception as e:  # noqa: BLE001
            lines.append(f"| py-grpc | {backend} | failed: {str(e)[:80]} |")
        print(lines[-1], flush=True)
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
