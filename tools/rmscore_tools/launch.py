"""Starting server kinds as child processes and waiting on their health: shared by `rmscore up`,
`rmscore bench` (with `--overhead`), `rmscore hardening` and the tests, so all of them launch
servers exactly alike.

`start(kind, port=0, **flags)` runs a kind on 127.0.0.1 with `--port-file`: the server writes its
bound ports there once it listens, so port 0 (ephemeral) needs no guessing and a fixed port (a
server restarted where its clients look) is checked. The log goes to a file; only the started
process is ever signalled, by its PID.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rmscore_tools import kinds
from rmscore_tools.host import ROOT  # the checkout: build/, models/

# RMSCORE_CPP_BINARY points at another build (the sanitizer one in scripts/test.sh).
CPP_BINARY = ROOT / os.environ.get("RMSCORE_CPP_BINARY", "build/cpp/rmscore-server-cpp")


def transport(kind: str) -> str:
    return kinds.get(kind).transport


def built_kinds() -> list[str]:
    """The kinds this checkout can start: every Python kind; cpp-grpc once its binary is built."""
    return [k for k in kinds.ALL_KINDS if kinds.KINDS[k].language != "cpp" or CPP_BINARY.exists()]


def command(kind: str, **flags) -> list[str]:
    """The kind's command line; flags use the shared names (docs/contract.md), None drops one."""
    k = kinds.get(kind)
    if k.language == "cpp":
        cmd = [str(CPP_BINARY)]
    else:
        cmd = [sys.executable, "-m", "rmscore.cli", "serve", "--transport", k.transport, "--backend", k.runtime]
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
               tls_ca_file: str | os.PathLike | None = None, poll_s: float = 0.1) -> None:
    """Poll health until SERVING; raise with the server's log if it exits or the deadline passes."""
    while not is_ready(kind, port, tls_ca_file=tls_ca_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else "not ready in time"
            log = log_path.read_text(errors="replace")[-4000:] if log_path and log_path.exists() else ""
            raise RuntimeError(f"{kind} {why}:\n{log}")
        time.sleep(poll_s)


@dataclass
class RunningServer:
    kind: str
    transport: str
    proc: subprocess.Popen
    port: int
    metrics_port: int
    log_path: pathlib.Path
    #: The flags it was started with (but `port`): `start(kind, port=s.port, **s.flags)` restarts it.
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
                             verify=ssl_context(self.tls_ca_file)).text
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def is_ready(self) -> bool:
        return is_ready(self.kind, self.port, tls_ca_file=self.tls_ca_file)

    def wait_until_ready(self, deadline: float, poll_s: float = 0.1) -> None:
        wait_ready(self.kind, self.port, self.proc, deadline, self.log_path, self.tls_ca_file, poll_s)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 40) -> int:
        """SIGTERM (the server drains), SIGKILL if it has not exited within `timeout_s`; the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start(kind: str, port: int = 0, *, ready_timeout_s: float = 400, wait_ready: bool = True,
          tls_ca_file: str | os.PathLike | None = None, log_dir: str | os.PathLike | None = None,
          poll_s: float = 0.1, env: dict[str, str] | None = None, **flags) -> RunningServer:
    """Start `kind` on 127.0.0.1:`port` (0: ephemeral; the metrics port is ephemeral unless
    `metrics_port` says otherwise) with `flags` (docs/contract.md names); once bound, and with
    `wait_ready` once SERVING, its RunningServer. Its log is `log_dir`/server.log (default: a fresh
    temporary directory, so no old port file is ever read). `tls_ca_file` verifies the server's
    certificate for the health checks (default: `tls_cert_file` itself, right for a self-signed one).
    `poll_s`: between health checks (each one a new connection); `env`: added to this process's
    environment for the server. Raises with the log's tail if it
    exits, or does not bind or get ready within `ready_timeout_s`; the process is killed then."""
    if tls_ca_file is None and flags.get("tls_cert_file"):
        tls_ca_file = flags["tls_cert_file"]
    run_dir = pathlib.Path(log_dir) if log_dir else pathlib.Path(tempfile.mkdtemp(prefix=f"rmscore-{kind}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    port_file, log_path = run_dir / "ports.json", run_dir / "server.log"
    port_file.unlink(missing_ok=True)
    cmd = command(kind, port=port, port_file=port_file, **{"metrics_port": 0, **flags})
    deadline = time.monotonic() + ready_timeout_s
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        # The server writes the file (atomically) only once it listens on every port.
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not bind port {port} (exit {proc.poll()}):\n"
                                   f"{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(min(poll_s, 0.05))
        ports = json.loads(port_file.read_text())
        if port and ports["port"] != port:
            raise RuntimeError(f"{kind} bound port {ports['port']}, not the {port} asked for")
        server = RunningServer(kind, transport(kind), proc, ports["port"], ports["metrics_port"], log_path,
                               flags, pathlib.Path(tls_ca_file) if tls_ca_file else None)
        if wait_ready:
            server.wait_until_ready(deadline, poll_s)
    except BaseException:  # Ctrl-C too: never leave a server behind
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    return server
