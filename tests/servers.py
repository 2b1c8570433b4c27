"""Real rmscore servers as child processes on loopback, for every test that needs one.

`start(kind, **flags)` launches a server kind on ephemeral ports (`--port 0
--metrics-port 0 --port-file F`), waits for the port file, then for readiness
(gRPC health SERVING, or HTTP /readyz), and returns a `RunningServer`. Only
the processes started here are ever signalled, by PID.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx

from rmscore import launch

ROOT = launch.ROOT
MODEL = ROOT / "models" / "default"
CPP_BINARY = launch.CPP_BINARY
KINDS = launch.KINDS


def available_kinds() -> list[str]:
    """Every kind, unless RMSCORE_TEST_KINDS (comma list) narrows it; cpp-grpc needs its binary."""
    wanted = os.environ.get("RMSCORE_TEST_KINDS")
    kinds = wanted.split(",") if wanted else list(KINDS)
    return [k for k in kinds if k != "cpp-grpc" or CPP_BINARY.exists() or wanted]


@dataclass
class RunningServer:
    kind: str
    transport: str
    proc: subprocess.Popen
    port: int
    metrics_port: int
    log_path: pathlib.Path
    flags: dict = field(default_factory=dict)
    #: The root that verifies the server's certificate (None: plaintext server).
    tls_ca_file: pathlib.Path | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls_ca_file else 'http'}://127.0.0.1:{self.port}"

    def metrics_text(self) -> str:
        # The HTTP server serves /metrics on its own (TLS, if on) port; the gRPC servers on a plain one.
        if self.transport == "http" and self.tls_ca_file:
            return httpx.get(f"https://127.0.0.1:{self.metrics_port}/metrics", timeout=10,
                             verify=launch.ssl_context(self.tls_ca_file)).text
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 40) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def command(kind: str, model: pathlib.Path = MODEL, **flags) -> list[str]:
    """Every kind gets the same batching and thread flags unless a test says otherwise."""
    return launch.command(kind, **{"model": str(model), "max_queue_delay_ms": 2, "intra_op_threads": 1, **flags})


def start(kind: str, ready_timeout_s: float = 400, wait_ready: bool = True,
          tls_ca_file: str | pathlib.Path | None = None, **flags) -> RunningServer:
    """`tls_ca_file`: what verifies the server's certificate (default: `tls_cert_file` itself,
    right for the self-signed certificates tests make)."""
    transport = launch.transport(kind)
    if tls_ca_file is None and flags.get("tls_cert_file"):
        tls_ca_file = flags["tls_cert_file"]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"rmscore-{kind}-"))
    port_file, log_path = tmp / "ports.json", tmp / "server.log"
    cmd = command(kind, port=0, metrics_port=0, port_file=port_file, **flags)
    log = open(log_path, "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    deadline = time.monotonic() + ready_timeout_s
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{kind} did not bind (exit {proc.poll()}):\n{log_path.read_text()}")
        time.sleep(0.05)
    ports = json.loads(port_file.read_text())
    server = RunningServer(kind, transport, proc, ports["port"], ports["metrics_port"], log_path, flags,
                           pathlib.Path(tls_ca_file) if tls_ca_file else None)
    if wait_ready:
        try:
            wait_until_ready(server, deadline)
        except Exception:
            server.stop(5)
            raise
    return server


def is_ready(server: RunningServer) -> bool:
    return launch.is_ready(server.kind, server.port, tls_ca_file=server.tls_ca_file)


def wait_until_ready(server: RunningServer, deadline: float) -> None:
    launch.wait_ready(server.kind, server.port, server.proc, deadline, server.log_path, server.tls_ca_file)
