#!/usr/bin/env python3
"""The GPU check (docs/gpu.md): parity of each CUDA runtime against fp32 eager, then throughput.

Runs in a few minutes on a machine with a CUDA GPU, PyTorch and an ONNX Runtime:
1. parity on the manifest's golden inputs (each alone and as one padded batch): PyTorch
   eager in fp32, bf16 and fp16 autocast, torch.compile, and ONNX Runtime's CUDA provider
   when onnxruntime-gpu is installed, each against the golden eager-fp32 CPU scores;
2. in-process throughput at batch sizes 1..256 (length 128), as ratios to eager fp32;
3. every server kind at saturation whose dependencies are present (closed loop,
   16 concurrent requests of 32 sequences x 128 tokens, fixed time; rmscore_tools's caller and
   load generator), on ephemeral ports.
A part whose dependencies are missing is a row saying "unavailable: <why>", never a crash.
Prints one markdown table per part and writes them to --out.

    python tools/rmscore_tools/bench/gpu_check.py --model models/default --out gpu_report.md
    python tools/rmscore_tools/bench/gpu_check.py --device cpu --quick   # dry run of the whole pipeline, no GPU

Only the standard library is imported up front, so a bare machine (python, torch,
onnxruntime, numpy: scripts/gpu_run.sh adds the carried rest) reaches the clear errors.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]  # tools/rmscore_tools/bench/gpu_check.py -> the checkout
# The server, the client (its stubs) and the tools from the checkout: the carry installs none. Run as a
# file, not with -m, so that a bare machine reaches the clear errors with the standard library alone.
SOURCES = [str(ROOT / "server_py"), str(ROOT / "client"), str(ROOT / "tools")]
# Not this file's own folder, which Python puts first for a script: its modules are the package's.
sys.path[:] = SOURCES + [p for p in sys.path if pathlib.Path(p or ".").resolve() != pathlib.Path(__file__).resolve().parent]

ALL_RUNTIMES = "eager:fp32,eager:bf16,eager:fp16,compile:fp32,onnxruntime:fp32"
QUICK_RUNTIMES = "eager:fp32,eager:fp16,onnxruntime:fp32"
# compile last: its warm-up is the longest, and a run cut short keeps the others.
ALL_SERVERS = "cpp-grpc,py-grpc-onnxruntime,py-http-onnxruntime,py-grpc-eager,py-grpc-compile"
QUICK_SERVERS = "cpp-grpc,py-grpc-onnxruntime,py-http-onnxruntime"
# What a Python server kind imports beyond torch/numpy/onnxruntime (rmscore_tools.launch needs the first two).
SERVER_MODULES = ["grpc", "httpx", "grpc_health", "grpc_reflection", "google.protobuf", "prometheus_client",
                  "tokenizers", "yaml"]
HTTP_MODULES = ["fastapi", "uvicorn", "pydantic", "starlette"]
TORCH_MODULES = ["transformers", "safetensors"]


def missing(modules: list[str]) -> list[str]:
    out = []
    for m in modules:
        try:
            if importlib.util.find_spec(m) is None:
                out.append(m)
        except ModuleNotFoundError:  # a parent package (google) is absent
            out.append(m)
    return out


def no_cuda_reason() -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    return (f"--device cuda: PyTorch sees no CUDA device (torch {torch.__version__}, cuda build: "
            f"{torch.version.cuda}); run this on a GPU machine, or pass --device cpu for a dry run")


def make(repo, model: pathlib.Path, backend: str, precision: str, device: str, max_batch: int):
    from rmscore import runtimes
    from rmscore.core.config import ServeConfig

    cfg = ServeConfig(model=model, backend=backend, precision=precision, device=device,
                      intra_op_threads=os.cpu_count() or 1)
    be = runtimes.create(cfg, repo)
    be.warmup(max_batch, repo.max_sequence_length)
    return be


def parity(repo, be) -> float:
    """Max abs diff against the golden scores, each sequence alone and all as one padded batch."""
    import numpy as np

    from rmscore.model.padding import pad_batch

    seqs, golden = repo.golden()
    ref = np.asarray(golden, dtype=np.float64)
    alone = np.array([be.score(*pad_batch([s], repo.pad_token_id))[0] for s in seqs], dtype=np.float64)
    batched = np.asarray(be.score(*pad_batch(seqs, repo.pad_token_id)), dtype=np.float64)
    return float(max(np.abs(alone - ref).max(), np.abs(batched - ref).max()))


def throughput(be, batch: int, seconds: float, length: int = 128) -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    be.score(ids, mask)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        be.score(ids, mask)  # returns numpy: the device work is synchronised
        n += batch
    return n / (time.perf_counter() - t0)


def tolerance(backend: str, precision: str) -> float:
    from rmscore.runtimes import AUTOCAST_TOLERANCE, TOLERANCE

    return AUTOCAST_TOLERANCE.get(precision, TOLERANCE[backend])


def runtime_rows(a, repo, model: pathlib.Path, batches: list[int]) -> tuple[list[str], bool]:
    lines = ["| runtime | precision | max abs diff vs eager fp32 (CPU golden) | " +
             " | ".join(f"B={b} seq/s" for b in batches) + " |", "|---|---|---|" + "---|" * len(batches)]
    base, ok = None, True
    for spec in a.runtimes.split(","):
        backend, precision = spec.split(":")
        gone = missing(TORCH_MODULES) if backend in ("eager", "compile") else []
        try:
            if gone:
                raise RuntimeError(f"missing Python packages: {', '.join(gone)}")
            be = make(repo, model, backend, precision, a.device, max(batches))
        except Exception as e:  # noqa: BLE001 - a runtime missing here is reported, not fatal
            lines.append(f"| {backend} | {precision} | unavailable: {one_line(e)} |")
            emit(lines[-1])
            continue
        diff, tol = parity(repo, be), tolerance(backend, precision)
        ok &= diff <= tol
        tput = [throughput(be, b, a.seconds) for b in batches]
        base = base or tput
        cells = " | ".join(f"{t:.4g} ({t / b0:.2f}x)" for t, b0 in zip(tput, base))
        verdict = "" if diff <= tol else f" OVER tolerance {tol:.0e}"
        lines.append(f"| {backend} | {precision} | {diff:.2e}{verdict} | {cells} |")
        emit(lines[-1])
        del be
        if a.device == "cuda":
            import torch

            torch.cuda.empty_cache()
    return lines, ok


PARTIAL: list[pathlib.Path] = []


def emit(line: str) -> None:
    """Each row as it is measured, on stdout and in --out, so a run cut short by a time limit
    still leaves what it measured (the full tables replace the file at the end)."""
    print(line, flush=True)
    for path in PARTIAL:
        with open(path, "a") as f:
            f.write(line + "\n")


def one_line(e: BaseException | str) -> str:
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__).replace("|", "/")[:160]


def server_unavailable(kind: str) -> str | None:
    if kind == "cpp-grpc":
        from rmscore_tools import launch
        if not launch.CPP_BINARY.exists():
            return f"{launch.CPP_BINARY.relative_to(ROOT)} not built here (a CUDA build is not carried)"
        gone = missing(["grpc"])
    else:
        gone = missing(SERVER_MODULES + (HTTP_MODULES if kind.startswith("py-http") else [])
                       + (TORCH_MODULES if not kind.endswith("onnxruntime") else []))
    return f"missing Python packages: {', '.join(gone)}" if gone else None


def saturate(kind: str, model: pathlib.Path, device: str, seconds: float, clients: int) -> float:
    import numpy as np

    from rmscore_tools import launch
    path = SOURCES + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    try:
        server = launch.start(kind, model=model, device=device, max_batch_size=256, max_batch_tokens=65536,
                              intra_op_threads=os.cpu_count() or 1, ready_timeout_s=900,
                              env={"PYTHONPATH": os.pathsep.join(path)})
    except RuntimeError as e:
        raise RuntimeError(one_line(str(e))) from None
    try:
        rng = np.random.default_rng(1)
        seqs = [rng.integers(1000, 20000, 128).tolist() for _ in range(32)]
        r = asyncio.run(_closed_loop(server, seqs, seconds, clients))
    finally:
        server.stop(60)
    if not r["throughput_seq_s"] > 0:
        raise RuntimeError(f"no answer in {seconds} s: {r['errors']} errors {r['error_kinds']}")
    return r["throughput_seq_s"]


async def _closed_loop(server, seqs: list[list[int]], seconds: float, clients: int) -> dict:
    """`clients` requests of `seqs` always in flight for `seconds`, after one unmeasured request."""
    from rmscore_tools import caller, loadgen

    c = caller.async_client(server.transport, caller.target_of(server), chunk_size=len(seqs), timeout_s=120)
    try:
        await loadgen.score_set(c, seqs)
        return await loadgen.closed_loop(c, [seqs], clients, seconds)
    finally:
        await c.close()


def server_rows(a, model: pathlib.Path) -> list[str]:
    head = ["", f"| server | seq/s at saturation ({a.clients} x 32 x 128 tokens) | ratio to py-grpc-eager |",
            "|---|---|---|"]
    kinds = a.servers.split(",")
    try:
        from rmscore_tools import launch  # noqa: F401 - needs grpc and httpx
        from rmscore_tools import caller, loadgen  # noqa: F401 - need rmscore_client (grpc, protobuf)
    except ImportError as e:
        return head + [f"| {k} | unavailable: {one_line(e)} | |" for k in kinds]
    result: dict[str, float | str] = {}
    for kind in kinds:
        why = server_unavailable(kind)
        if why is None:
            try:
                result[kind] = saturate(kind, model, a.device, a.server_seconds, a.clients)
            except Exception as e:  # noqa: BLE001 - one kind failing must not hide the others
                why = one_line(e)
        result.setdefault(kind, f"unavailable: {why}")
        v = result[kind]
        emit(f"| {kind} | {v if isinstance(v, str) else f'{v:.4g} seq/s'} |")
    base = result.get("py-grpc-eager")
    return head + [f"| {k} | {v:.4g} | {v / base:.2f}x |" if isinstance(v, float) and isinstance(base, float)
                   else f"| {k} | {v if isinstance(v, str) else f'{v:.4g}'} | |" for k, v in result.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/default"))
    ap.add_argument("--out", default="gpu_report.md")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the whole pipeline on a machine without a GPU")
    ap.add_argument("--quick", action="store_true", help="small batches, short timings, fewer runtimes and servers")
    ap.add_argument("--batches", help="default 1,4,16,64,256 (quick: 1,4)")
    ap.add_argument("--runtimes", help=f"backend:precision list (default {ALL_RUNTIMES}; quick: {QUICK_RUNTIMES})")
    ap.add_argument("--servers", help=f"server kinds, '' for none (default {ALL_SERVERS}; quick: {QUICK_SERVERS})")
    ap.add_argument("--seconds", type=float, help="per throughput point (default 2; quick 0.5)")
    ap.add_argument("--server-seconds", type=float, help="per server (default 10; quick 3)")
    ap.add_argument("--clients", type=int, help="concurrent requests per server (default 16; quick 4)")
    a = ap.parse_args()
    q = a.quick
    a.batches = a.batches or ("1,4" if q else "1,4,16,64,256")
    a.runtimes = a.runtimes or (QUICK_RUNTIMES if q else ALL_RUNTIMES)
    a.servers = a.servers if a.servers is not None else (QUICK_SERVERS if q else ALL_SERVERS)
    a.seconds = a.seconds or (0.5 if q else 2.0)
    a.server_seconds = a.server_seconds or (3.0 if q else 10.0)
    a.clients = a.clients or (4 if q else 16)
    for need in ("numpy", "torch"):
        if missing([need]):
            print(f"gpu_check: {need} is not importable by {sys.executable}; it must be the machine's own",
                  file=sys.stderr)
            return 2
    import torch

    if a.device == "cuda" and (why := no_cuda_reason()):
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    from rmscore.model.repository import load_repo

    model = pathlib.Path(a.model).resolve()
    repo = load_repo(model)
    try:
        import onnxruntime as ort

        ort_text = f"onnxruntime {ort.__version__} {ort.get_available_providers()}"
    except ImportError:
        ort_text = "no onnxruntime"
    where = (torch.cuda.get_device_name(0) if a.device == "cuda"
             else f"CPU dry run ({platform.processor() or 'cpu'}, {os.cpu_count()} cores)")
    lines = [f"# GPU check: {where}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {ort_text}",
             "", f"model {repo.name} ({repo.version}, {model}); golden inputs: {len(repo.golden()[0])}", ""]
    batches = [int(b) for b in a.batches.split(",")]
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n(partial: rows as measured)\n")
    PARTIAL.append(pathlib.Path(a.out))
    rows, ok = runtime_rows(a, repo, model, batches)
    lines += rows
    if a.servers:
        lines += server_rows(a, model)
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not ok:
        print("gpu_check: a runtime's parity is over its tolerance (see the table)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
