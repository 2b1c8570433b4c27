"""Starting server kinds as child processes and waiting on their health: shared by `rmscore up`,
`rmscore bench` and the tests, so all of them launch servers exactly alike."""

from __future__ import annotations

import os
import pathlib
import ssl
import sys
import time

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
# RMSCORE_CPP_BINARY points at another build (the sanitizer one in scripts/test.sh).
CPP_BINARY = ROOT / os.environ.get("RMSCORE_CPP_BINARY", "build/cpp/rmscore-server-cpp")
_PY = [sys.executable, "-m", "rmscore.cli", "serve"]

# kind -> (transport, command without flags)
KINDS: dict[str, tuple[str, list[str]]] = {
    "cpp-grpc": ("grpc", [str(CPP_BINARY)]),
    "py-grpc-eager": ("grpc", _PY + ["--transport", "grpc", "--backend", "eager"]),
    "py-grpc-compile": ("grpc", _PY + ["--transport", "grpc", "--backend", "compile"]),
    "py-grpc-onnxruntime": ("grpc", _PY + ["--transport", "grpc", "--backend", "onnxruntime"]),
    "py-http-onnxruntime": ("http", _PY + ["--transport", "http", "--backend", "onnxruntime"]),
}


def transport(kind: str) -> str:
    return KINDS[kind][0]


def command(kind: str, **flags) -> list[str]:
    """The kind's command line; flags use the shared names (docs/contract.md), None drops one."""
    cmd = list(KINDS[kind][1])
    for k, v in flags.items():
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def is_ready(kind: str, port: int, host: str = "127.0.0.1", tls_ca_file: str | os.PathLike | None = None) -> bool:
    """gRPC health SERVING, or HTTP /readyz 200. Health needs no token; with `tls_ca_file` (the
    root that signed the server's certificate, or a self-signed certificate itself) over TLS."""
    if transport(kind) == "http":
        scheme = "https" if tls_ca_file else "http"
        try:
            return httpx.get(f"{scheme}://{host}:{port}/readyz", timeout=2,
                             verify=ssl_context(tls_ca_file) if tls_ca_file else True).status_code == 200
        except httpx.HTTPError:
            return False
    target = f"{host}:{port}"
    with (grpc.secure_channel(target, grpc.ssl_channel_credentials(pathlib.Path(tls_ca_file).read_bytes()))
          if tls_ca_file else grpc.insecure_channel(target)) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        except grpc.RpcError:
            return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


def ssl_context(ca_file: str | os.PathLike) -> ssl.SSLContext:
    """An HTTPS client context trusting `ca_file` alone."""
    return ssl.create_default_context(cafile=os.fspath(ca_file))


def wait_ready(kind: str, port: int, proc, deadline: float, log_path: pathlib.Path | None = None,
               tls_ca_file: str | os.PathLike | None = None) -> None:
    """Poll health until SERVING; raise with the server's log if it exits or the deadline passes."""
    while not is_ready(kind, port, tls_ca_file=tls_ca_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else "not ready in time"
            log = log_path.read_text(errors="replace")[-4000:] if log_path and log_path.exists() else ""
            raise RuntimeError(f"{kind} {why}:\n{log}")
        time.sleep(0.1)
