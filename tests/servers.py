"""Real rmscore servers as child processes on loopback, for every test that needs one.

The launcher itself is the library's (`rmscore_tools.launch.start`: port file, log capture, readiness,
signals by PID only); this module adds what only tests want: `available_kinds()` narrowed by
RMSCORE_TEST_KINDS, and the default model plus small batching and thread flags on every server.
`start(kind, **flags)` launches a kind on ephemeral ports (or `port=`, fixed), waits for it to
bind, then for readiness (gRPC health SERVING, or HTTP /readyz), and returns a `RunningServer`.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

from rmscore_tools import kinds, launch
from rmscore_tools.launch import RunningServer  # noqa: F401 - re-exported for the tests

ROOT = launch.ROOT
MODEL = ROOT / "models" / "default"
CPP_BINARY = launch.CPP_BINARY
# Every kind gets the same batching and thread flags unless a test says otherwise. The default batching
# (cost_aware) measures its cost table once per configuration in a test run (conftest.py keeps the cache):
# 3 s instead of 10 bounds what that adds to the tiers.
TEST_FLAGS = {"max_queue_delay_ms": 2, "intra_op_threads": 1, "cost_profile_seconds": 3}


def available_kinds() -> list[str]:
    """Every kind, unless RMSCORE_TEST_KINDS (comma list) narrows it; cpp-grpc needs its binary
    unless named there (then a missing binary fails the tests instead of skipping them)."""
    wanted = os.environ.get("RMSCORE_TEST_KINDS")
    return wanted.split(",") if wanted else launch.built_kinds()


#: Kinds that run another kind's frontend and core with another backend: (kind, the kind it repeats).
SAME_FRONTEND_AS = (("py-grpc-compile", "py-grpc-onnxruntime"), ("py-grpc-eager", "py-grpc-onnxruntime"))


def frontend_kinds() -> list[str]:
    """`available_kinds()` less the kinds that only repeat another's frontend and core with another
    backend (SAME_FRONTEND_AS: py-grpc-eager and py-grpc-compile repeat py-grpc-onnxruntime's) unless
    RMSCORE_TEST_KINDS names them: for tests of the transports, batcher and process (faults, hostile
    input, TLS, shares, connection age), which would repeat that kind's tests at the price of another
    warm-up (about a minute each for compile, and together some minutes of CI). The contract tests,
    warm-up and elastic workers keep every kind."""
    kinds = available_kinds()
    if os.environ.get("RMSCORE_TEST_KINDS"):
        return kinds
    return [k for k in kinds if not any(k == same and other in kinds for same, other in SAME_FRONTEND_AS)]


def grpc_kind_per_language() -> list[str]:
    """One gRPC kind per frontend (C++, Python), the first of each in `available_kinds()` order: for
    tests of the gRPC frontend itself (reflection, stream limits), whatever the runtime behind it."""
    chosen: dict[str, str] = {}
    for k in available_kinds():
        if launch.transport(k) == "grpc":
            chosen.setdefault(kinds.get(k).language, k)
    return list(chosen.values())


def command(kind: str, model: pathlib.Path = MODEL, **flags) -> list[str]:
    return launch.command(kind, **{"model": str(model), **TEST_FLAGS, **flags})


def start(kind: str, port: int = 0, *, ready_timeout_s: float = 400, wait_ready: bool = True,
          model: str | os.PathLike = MODEL, **flags) -> RunningServer:
    """`launch.start` with the test defaults; `tls_ca_file` etc. as there."""
    return launch.start(kind, port, ready_timeout_s=ready_timeout_s, wait_ready=wait_ready,
                        **{"model": str(model), **TEST_FLAGS, **flags})


def is_ready(server: RunningServer) -> bool:
    return server.is_ready()


def wait_until_ready(server: RunningServer, deadline: float) -> None:
    server.wait_until_ready(deadline)


def start_all(kinds, started: list, ready_timeout_s: float = 400, **flags) -> list[RunningServer]:
    """Start every kind, then wait for each to be ready, so their warm-ups overlap. Appends to
    `started` as it goes: the caller's cleanup stops whatever did start when one fails."""
    for kind in kinds:
        started.append(start(kind, wait_ready=False, **flags))
    deadline = time.monotonic() + ready_timeout_s
    for server in started:
        wait_until_ready(server, deadline)
    return started


class HealthProbe:
    """A server's health as its own probes ask it, on one connection held for the test: gRPC
    grpc.health.v1 Check by service name, or HTTP GET of a probe path. Subclasses add what each
    test reads (readiness under both names, liveness, the stall gauge)."""

    def __init__(self, server: RunningServer):
        import grpc
        import httpx
        from grpc_health.v1 import health_pb2_grpc

        self.server = server
        if server.transport == "grpc":
            self.channel = grpc.insecure_channel(server.target)
            self.stub = health_pb2_grpc.HealthStub(self.channel)
        else:
            self.http = httpx.Client(base_url=server.base_url, timeout=5)

    def check(self, service: str) -> str:
        """gRPC: Check(`service`)'s status name ("SERVING", "NOT_SERVING", ...)."""
        from grpc_health.v1 import health_pb2

        r = self.stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def close(self) -> None:
        self.channel.close() if self.server.transport == "grpc" else self.http.close()


def model_repo_with_template(root: pathlib.Path, config_template=None, jinja: str | None = None) -> pathlib.Path:
    """The default model repository (files linked) with `config_template` in tokenizer_config.json
    and `jinja` as hf/chat_template.jinja."""
    root.mkdir()
    for f in MODEL.iterdir():
        if f.is_file():
            (root / f.name).symlink_to(f)
    (root / "hf").mkdir()
    for f in (MODEL / "hf").iterdir():
        if f.name != "tokenizer_config.json":
            (root / "hf" / f.name).symlink_to(f)
    cfg = json.loads((MODEL / "hf" / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    if config_template is not None:
        cfg["chat_template"] = config_template
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(cfg))
    if jinja is not None:
        (root / "hf" / "chat_template.jinja").write_text(jinja)
    return root
