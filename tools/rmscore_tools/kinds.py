"""The one registry of server kinds: what each is, and where `rmscore up` and the Locust users find it.

Every tool that names kinds (the launcher, `rmscore up`, `rmscore bench`, `rmscore hardening`, the
Locust file, the scripts and the tests) reads them from here. Imports nothing heavy: the Locust
file loads it under gevent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    language: str  # "cpp" | "python"
    transport: str  # "grpc" | "http"
    runtime: str  # the backend flag: "onnxruntime" | "eager" | "compile"
    port: int  # where `rmscore up` serves it and the Locust users look for it by default
    metrics_port: int  # Prometheus /metrics (the HTTP server serves it on `port`)
    locust_option: str  # the Locust file's target option; its env var is RMSCORE_<OPTION>

    @property
    def locust_env(self) -> str:
        return "RMSCORE_" + self.locust_option.upper()

    @property
    def default_target(self) -> str:
        """The Locust users' default target: HOST:PORT for gRPC, a base URL for HTTP."""
        return f"http://127.0.0.1:{self.port}" if self.transport == "http" else f"127.0.0.1:{self.port}"


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("cpp-grpc", "cpp", "grpc", "onnxruntime", 50051, 9101, "target_cpp"),
    Kind("py-grpc-onnxruntime", "python", "grpc", "onnxruntime", 50054, 9104, "target_py_ort"),
    Kind("py-grpc-eager", "python", "grpc", "eager", 50052, 9102, "target_py_eager"),
    Kind("py-grpc-compile", "python", "grpc", "compile", 50053, 9103, "target_py_compile"),
    Kind("py-http-onnxruntime", "python", "http", "onnxruntime", 8000, 8000, "target_http"),
)}
ALL_KINDS: tuple[str, ...] = tuple(KINDS)
RUNTIMES: tuple[str, ...] = ("onnxruntime", "eager", "compile")


def get(name: str) -> Kind:
    """The kind called `name`; a ValueError that lists the known kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown server kind {name!r}; choose from {', '.join(ALL_KINDS)}") from None


def unknown(names) -> list[str]:
    return [n for n in names if n not in KINDS]
