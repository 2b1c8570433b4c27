"""The server configuration: one typed object, parsed once from flags, validated eagerly.

The flag names are shared with the C++ server (docs/contract.md), so one
command line means the same thing to every runtime.
"""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import dataclass, field

from rmscore.core.cost_profile import default_dir as cost_profile_default_dir
from rmscore.core.planner import MODES, PlannerConfig

TRANSPORTS = ("grpc", "http")
BACKENDS = ("eager", "compile", "onnxruntime")
GRAPH_LEVELS = ("disable", "basic", "extended", "all")
# ---- precision (docs/precision.md) ----
# fp32 everywhere; int8: ONNX Runtime's quantized graph; bf16/fp16: PyTorch autocast, or for
# ONNX Runtime on --device cuda an fp16 graph.
PRECISIONS = ("fp32", "int8", "bf16", "fp16")
CPUINFO = pathlib.Path("/proc/cpuinfo")
#: The CPU flags (any one) under which a 16-bit float runs natively; without them torch emulates
#: it, slower than fp32.
CPU_FLAGS_FOR = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def cpu_flags() -> set[str]:
    text = (_read(CPUINFO) or b"").decode(errors="replace")
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def precision_problem(precision: str, backend: str, device: str) -> str | None:
    """Why this precision cannot run here, or None: checked at start, before any model loads."""
    if precision not in PRECISIONS:
        return f"must be one of {PRECISIONS}"
    if precision == "int8" and backend != "onnxruntime":
        return "int8 needs --backend onnxruntime"
    if backend == "onnxruntime" and (precision == "bf16" or precision == "fp16" and device != "cuda"):
        return ("bf16/fp16 autocast needs --backend eager or compile (ONNX Runtime runs fp16 only as a GPU graph, "
                "with --device cuda)")
    if backend != "onnxruntime" and device == "cpu" and precision in CPU_FLAGS_FOR:
        need = CPU_FLAGS_FOR[precision]
        if not set(need) & cpu_flags():
            return (f"{precision} on --device cpu needs {' or '.join(need)} among the CPU flags in {CPUINFO}, and "
                    f"this CPU has none: torch would emulate {precision}, slower than fp32")
    return None
# ---- end precision ----


class ConfigError(ValueError):
    pass


#: --model-workers auto: measured at warm-up (runtimes/workers.py).
AUTO_WORKERS = 0
#: --model-workers elastic, the default: one batcher thread per intra-op thread sharing a one-thread
#: session, and a session of every intra-op thread for a batch that runs alone (runtimes/workers.py).
ELASTIC_WORKERS = -1


def parse_workers(value: str) -> int:
    """--model-workers: "elastic" (ELASTIC_WORKERS), "auto" (AUTO_WORKERS) or a count >= 1."""
    if value == "elastic":
        return ELASTIC_WORKERS
    if value == "auto":
        return AUTO_WORKERS
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 1:
        raise ConfigError(f"--model-workers: must be 'elastic', 'auto' or an integer >= 1, got {value!r}")
    return count


#: The most of --drain-grace-seconds kept for failing what is left and closing the transports after the
#: drain (docs/contract.md); the C++ server's kShutdownReserveMaxS.
SHUTDOWN_RESERVE_MAX_S = 3.0

#: The most seconds a gRPC channel argument in milliseconds (an int32) holds; the C++ server's kMaxChannelSeconds.
MAX_CHANNEL_SECONDS = 2147483

#: The most items a request's list of sequences or texts may have on the HTTP server, which reads no
#: longer JSON list (frontends/body_lists.py): --max-sequences-per-request is at most this there. Here,
#: not in core/validation.py, so that config stays importable without grpc (tools/rmscore_tools/bench/
#: gpu_check.py runs on a bare GPU machine).
MOST_LIST_ITEMS = 65536


def _read(path: pathlib.Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


# What a header value may hold (RFC 7230 visible ASCII; gRPC metadata allows the same).
_TOKEN_BYTES = frozenset(range(0x21, 0x7F))
_SPACE = b" \t\r\n\f\v"


@dataclass(frozen=True)
class ServeConfig:
    model: pathlib.Path
    transport: str = "grpc"
    backend: str = "onnxruntime"
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9100
    port_file: pathlib.Path | None = None
    #: cost_aware: the batch doing the most work (its sequences at their own best batch's cost) per
    #: second of measured model time (docs/batching.md);
    #: length_aware and fifo stay for ablations.
    batching: str = "cost_aware"
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_queue_delay_ms: float = 2.0
    #: A batch grows only while its expected model time (the measured time per token) stays within
    #: this, so a caller waits at most about this for the batches running (planner.py). 0: no bound.
    max_batch_ms: float = 500.0
    max_queue_sequences: int = 4096
    #: Admission by work (core/admission.py): a request is refused RESOURCE_EXHAUSTED at once when the
    #: model time already queued ahead of it exceeds this. 0: no bound (deadlines are still checked).
    max_queue_wait_seconds: float = 60.0
    max_sequences_per_request: int = 1024
    max_request_bytes: int = 16 * 1024 * 1024
    #: Bytes of accepted requests held until answered, summed over every call (core/admission.py
    #: HeldBytes: 8 per token id as sent, 1 per text character); a request that would pass it is refused
    #: RESOURCE_EXHAUSTED before it is queued. 1 GiB: 64x a full queue of full-window sequences
    #: (4096 x 512 ids x 8 bytes = 16 MiB), so load the other bounds accept never meets it; only ids sent
    #: far past the window that truncation drops do (issue 29, defect 1).
    max_queued_request_bytes: int = 1 << 30
    intra_op_threads: int = 2
    inter_op_threads: int = 1
    graph_optimization_level: str = "all"
    precision: str = "fp32"
    device: str = "cpu"
    drain_grace_seconds: float = 30.0
    #: gRPC only: a connection older than this gets a GOAWAY, so a round_robin client resolves the
    #: name again and finds replicas added since (docs/deploy.md, Kubernetes); gRPC adds +-10% jitter.
    max_connection_age_seconds: float = 300.0
    #: How long calls in flight on a connection past its age may still finish before it is closed.
    max_connection_age_grace_seconds: float = 30.0
    #: Times the backend's warm-up set runs before the self-check (same flag in the C++ server).
    warmup_rounds: int = 1
    #: The cost table (core/cost_profile.py): loaded from this file when it exists, else measured at
    #: warm-up within --cost-profile-seconds and saved here. None: measured, not saved.
    cost_profile: pathlib.Path | None = None
    cost_profile_seconds: float = 10.0
    #: Without --cost-profile, the table is cached here per model, backend, device, precision, threads and
    #: batch size limit (core/cost_profile.py): measured once per machine, reused, replaced when it does
    #: not match. None (--cost-profile-dir none): measured at every start, never saved.
    cost_profile_dir: pathlib.Path | None = field(default_factory=cost_profile_default_dir)
    #: Model sessions run in parallel, each with intra_op_threads / model_workers threads; AUTO_WORKERS:
    #: measured; ELASTIC_WORKERS: a lone batch gets every thread, concurrent batches one each.
    model_workers: int = ELASTIC_WORKERS
    # Access control (docs/contract.md): TLS with both files, a shared bearer token from a
    # file (never a flag value, so it does not show in `ps`). None: off.
    tls_cert_file: pathlib.Path | None = None
    tls_key_file: pathlib.Path | None = None
    auth_token_file: pathlib.Path | None = None
    #: The token file's content, whitespace around it stripped; read once, at config time.
    auth_token: str | None = field(default=None, init=False, repr=False, compare=False)
    # ---- framework text (py-http's /get_reward and vLLM pooling routes; frontends/reward_text.py) ----
    #: Strings removed from every query and prompt before tokenizing: the policy's EOS, pad, template markers.
    strip_strings: tuple[str, ...] = ()
    #: Render each (prompt, response) pair with this chat template (a file, or `model`: the model
    #: repository's hf/tokenizer_config.json chat_template) before tokenizing; None: encode(prompt, response).
    #: Read and compiled where the HTTP server starts (frontends/reward_text.py `chat_template`).
    chat_template: str | None = None

    def _check_text(self, check) -> None:
        for s in self.strip_strings:
            check(isinstance(s, str) and s != "", "strip-string", "must be a non-empty string", s)
        for flag, value in (("strip-string", self.strip_strings), ("chat-template", self.chat_template)):
            check(not value or self.transport == "http", flag,
                  "applies to the HTTP server's framework routes only; add --transport http", value)
    # ---- end of framework text ----
    # ---- text bounds (issue 29; Python kinds: the C++ server takes token ids only) ----
    #: The most characters a prompt, response, query or input text may have; a longer one is refused
    #: INVALID_ARGUMENT before anything is tokenized. None: 256 x the model's max_sequence_length
    #: (core/tokenizing.py default_max_text_chars; 131072 for a 512-token model).
    max_text_chars: int | None = None

    def _check_text_bounds(self, check) -> None:
        check(self.max_text_chars is None or (type(self.max_text_chars) is int and self.max_text_chars >= 1),
              "max-text-chars", "must be an integer >= 1 (default: 256 x the model's max_sequence_length)",
              self.max_text_chars)
    # ---- end of text bounds ----
    # Transport limits (docs/hardening.md; same flags in the C++ server).
    #: HTTP/2 streams one connection may have open at once (gRPC's max_concurrent_streams).
    max_concurrent_streams: int = 100
    #: ScoreStream items of one stream being scored or answered but unsent; at the bound the server
    #: stops reading that stream, so flow control holds its client back instead of the shared queue.
    max_stream_items_in_flight: int = 32
    #: HTTP: a request body not received whole within this is answered 408 and its connection closed.
    body_timeout_seconds: float = 30.0
    #: HTTP: bytes of request bodies being received, summed over all connections; a body that would
    #: pass it is refused 413 RESOURCE_EXHAUSTED. At least --max-request-bytes.
    max_buffered_request_bytes: int = 128 * 1024 * 1024
    #: Liveness (core/liveness.py): the gRPC health service "liveness" says NOT_SERVING and HTTP /livez
    #: answers 503 once work has waited this long with no batch completing. Default: five times the
    #: 60 s admission bound, and 50x the longest batch the default limits allow on this machine (16 x 512
    #: tokens, 5.4 s on one core): only a hang gets there. 0: never fails.
    liveness_stall_seconds: float = 300.0

    def __post_init__(self) -> None:
        def check(ok: bool, flag: str, rule: str, value) -> None:
            if not ok:
                raise ConfigError(f"--{flag}: {rule}, got {value!r}")

        check(self.transport in TRANSPORTS, "transport", f"must be one of {TRANSPORTS}", self.transport)
        check(self.backend in BACKENDS, "backend", f"must be one of {BACKENDS}", self.backend)
        check(self.batching in MODES, "batching", f"must be one of {MODES}", self.batching)
        check(self.graph_optimization_level in GRAPH_LEVELS, "graph-optimization-level",
              f"must be one of {GRAPH_LEVELS}", self.graph_optimization_level)
        check(self.device in ("cpu", "cuda"), "device", "must be cpu or cuda", self.device)
        problem = precision_problem(self.precision, self.backend, self.device)
        check(problem is None, "precision", problem, self.precision)
        for flag, value in (("port", self.port), ("metrics-port", self.metrics_port)):
            check(0 <= value <= 65535, flag, "must be a port number 0..65535 (0: ephemeral)", value)
        for flag, value in (("max-batch-size", self.max_batch_size), ("max-batch-tokens", self.max_batch_tokens),
                            ("max-queue-sequences", self.max_queue_sequences),
                            ("max-sequences-per-request", self.max_sequences_per_request),
                            ("max-request-bytes", self.max_request_bytes),
                            ("max-queued-request-bytes", self.max_queued_request_bytes),
                            ("intra-op-threads", self.intra_op_threads),
                            ("inter-op-threads", self.inter_op_threads),
                            ("warmup-rounds", self.warmup_rounds)):
            check(value >= 1, flag, "must be >= 1", value)
        check(self.max_queue_delay_ms >= 0, "max-queue-delay-ms", "must be >= 0", self.max_queue_delay_ms)
        check(0 <= self.max_batch_ms <= MAX_CHANNEL_SECONDS * 1000, "max-batch-ms",
              f"must be >= 0 and <= {MAX_CHANNEL_SECONDS * 1000}", self.max_batch_ms)
        check(0 <= self.max_queue_wait_seconds <= MAX_CHANNEL_SECONDS, "max-queue-wait-seconds",
              f"must be >= 0 and <= {MAX_CHANNEL_SECONDS}", self.max_queue_wait_seconds)
        check(self.drain_grace_seconds > 0, "drain-grace-seconds", "must be > 0", self.drain_grace_seconds)
        check(0 <= self.liveness_stall_seconds <= MAX_CHANNEL_SECONDS, "liveness-stall-seconds",
              f"must be >= 0 and <= {MAX_CHANNEL_SECONDS}", self.liveness_stall_seconds)
        check(self.model_workers <= self.intra_op_threads, "model-workers",
              f"each worker needs an intra-op thread: must be <= --intra-op-threads ({self.intra_op_threads})",
              self.model_workers)
        check(self.cost_profile_seconds > 0, "cost-profile-seconds", "must be > 0", self.cost_profile_seconds)
        check(self.cost_profile is None or self.cost_profile.parent.is_dir(), "cost-profile",
              "must be a file in an existing directory", str(self.cost_profile))
        check(self.cost_profile_dir is None or not self.cost_profile_dir.exists() or self.cost_profile_dir.is_dir(),
              "cost-profile-dir", "must be a directory (created when missing) or none", str(self.cost_profile_dir))
        # gRPC takes both in milliseconds in an int32.
        check(0 < self.max_connection_age_seconds <= MAX_CHANNEL_SECONDS, "max-connection-age-seconds",
              f"must be > 0 and <= {MAX_CHANNEL_SECONDS}", self.max_connection_age_seconds)
        check(0 <= self.max_connection_age_grace_seconds <= MAX_CHANNEL_SECONDS, "max-connection-age-grace-seconds",
              f"must be >= 0 and <= {MAX_CHANNEL_SECONDS}", self.max_connection_age_grace_seconds)
        check(self.max_sequences_per_request <= self.max_queue_sequences, "max-sequences-per-request",
              f"must be <= --max-queue-sequences ({self.max_queue_sequences})", self.max_sequences_per_request)
        self._check_transport_limits(check)
        self._check_access(check)
        check((self.model / "manifest.json").is_file(), "model",
              "must be a model repository with manifest.json (create one with `rmscore export`)", str(self.model))
        self._check_text(check)
        self._check_text_bounds(check)

    def _check_transport_limits(self, check) -> None:
        for flag, value in (("max-concurrent-streams", self.max_concurrent_streams),
                            ("max-stream-items-in-flight", self.max_stream_items_in_flight)):
            check(value >= 1, flag, "must be >= 1", value)
        check(0 < self.body_timeout_seconds <= MAX_CHANNEL_SECONDS, "body-timeout-seconds",
              f"must be > 0 and <= {MAX_CHANNEL_SECONDS}", self.body_timeout_seconds)
        check(self.max_buffered_request_bytes >= self.max_request_bytes, "max-buffered-request-bytes",
              f"must be >= --max-request-bytes ({self.max_request_bytes})", self.max_buffered_request_bytes)
        check(self.transport != "http" or self.max_sequences_per_request <= MOST_LIST_ITEMS,
              "max-sequences-per-request", f"must be <= {MOST_LIST_ITEMS} on the HTTP server, which reads a "
              "JSON list of no more items", self.max_sequences_per_request)

    def _check_access(self, check) -> None:
        """Same rules and messages as the C++ server (server_cpp/src/config.cc)."""
        cert, key = self.tls_cert_file, self.tls_key_file
        check(cert is None or key is not None, "tls-cert-file",
              "needs --tls-key-file too (TLS takes both or neither)", str(cert))
        check(key is None or cert is not None, "tls-key-file",
              "needs --tls-cert-file too (TLS takes both or neither)", str(key))
        for flag, path in (("tls-cert-file", cert), ("tls-key-file", key)):
            check(path is None or _read(path) is not None, flag, "cannot read the file", str(path))
        if self.auth_token_file is None:
            return
        raw = _read(self.auth_token_file)
        check(raw is not None, "auth-token-file", "cannot read the file", str(self.auth_token_file))
        token = raw.strip(_SPACE)
        check(bool(token), "auth-token-file", "the file holds no token", str(self.auth_token_file))
        # The token itself is never printed, only its file.
        check(set(token) <= _TOKEN_BYTES, "auth-token-file", "the token must be printable ASCII without spaces",
              str(self.auth_token_file))
        object.__setattr__(self, "auth_token", token.decode("ascii"))

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def shutdown_reserve_s(self) -> float:
        """min(SHUTDOWN_RESERVE_MAX_S, grace / 2): the same in every server."""
        return min(SHUTDOWN_RESERVE_MAX_S, self.drain_grace_seconds / 2)

    @property
    def connection_age_options(self) -> list[tuple[str, int]]:
        """The gRPC server channel arguments for the two connection-age flags (at least 1 ms each but the grace)."""
        return [("grpc.max_connection_age_ms", max(1, round(self.max_connection_age_seconds * 1000))),
                ("grpc.max_connection_age_grace_ms", round(self.max_connection_age_grace_seconds * 1000))]

    @property
    def planner(self) -> PlannerConfig:
        return PlannerConfig(self.max_batch_size, self.max_batch_tokens,
                             round(self.max_queue_delay_ms * 1000), self.batching, round(self.max_batch_ms * 1000))

    @property
    def server_label(self) -> str:
        """The metrics' and model info's `server`: the front end (a kind is a server with one backend)."""
        return "py-grpc" if self.transport == "grpc" else "py-http"


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ServeConfig.__dataclass_fields__
    p.add_argument("--transport", default=d["transport"].default, help="grpc or http (default: %(default)s)")
    p.add_argument("--backend", default=d["backend"].default, help="eager, compile or onnxruntime (default: %(default)s)")
    p.add_argument("--model", default="models/default", help="model repository (default: %(default)s)")
    p.add_argument("--host", default=d["host"].default)
    p.add_argument("--port", type=int, default=None, help="0: ephemeral (default: 50051 gRPC, 8000 HTTP)")
    p.add_argument("--port-file", default=None, help="write {port, metrics_port} JSON here once bound")
    for name in ("metrics_port", "max_batch_size", "max_batch_tokens", "max_queue_sequences",
                 "max_sequences_per_request", "max_request_bytes", "max_queued_request_bytes", "intra_op_threads",
                 "inter_op_threads", "warmup_rounds", "max_concurrent_streams", "max_stream_items_in_flight",
                 "max_buffered_request_bytes"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=d[name].default, help="(default: %(default)s)")
    for name in ("max_queue_delay_ms", "max_batch_ms", "max_queue_wait_seconds", "drain_grace_seconds",
                 "max_connection_age_seconds", "max_connection_age_grace_seconds", "cost_profile_seconds",
                 "body_timeout_seconds", "liveness_stall_seconds"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=d[name].default, help="(default: %(default)s)")
    for name in ("batching", "graph_optimization_level", "precision", "device"):
        p.add_argument("--" + name.replace("_", "-"), default=d[name].default, help="(default: %(default)s)")
    p.add_argument("--tls-cert-file", default=None, help="PEM certificate chain: serve TLS (with --tls-key-file)")
    p.add_argument("--tls-key-file", default=None, help="PEM private key of --tls-cert-file")
    p.add_argument("--auth-token-file", default=None,
                   help="file holding a shared bearer token required on every call but health")
    p.add_argument("--model-workers", default="elastic",
                   help="'elastic': a batch that runs alone gets every intra-op thread, batches that run at once "
                        "one thread each (ONNX Runtime; torch keeps 1 worker); N: N sessions run in parallel, each "
                        "with intra-op-threads / N threads; 'auto' measures 1, 2, 4 ... at warm-up and keeps the "
                        "fastest (default: %(default)s)")
    p.add_argument("--cost-profile", default=None,
                   help="cost table file: loaded when it exists (refused if measured for another model, backend, "
                        "device, precision, thread count or CPU), else measured at warm-up and saved there")
    p.add_argument("--cost-profile-dir", default=None,
                   help="without --cost-profile: cache of measured cost tables, one per model, backend, threads "
                        "and batch size; a cached table that does not match is measured again and replaced; "
                        "'none': measure at every start (default: $RMSCORE_CACHE_DIR/cost-profiles, else "
                        "$XDG_CACHE_HOME/rmscore/cost-profiles, else ~/.cache/rmscore/cost-profiles)")
    _add_text_arguments(p)


def _add_text_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strip-string", action="append", default=[], dest="strip_strings", metavar="S",
                   help="remove S from /get_reward and vLLM-route text before tokenizing (repeatable: EOS, pad)")
    p.add_argument("--chat-template", default=None, metavar="FILE|model",
                   help="render prompt/response pairs of those routes with this chat template "
                        "(model: the model repository's own)")
    p.add_argument("--max-text-chars", type=int, default=None, metavar="N",
                   help="refuse a text longer than N characters before tokenizing it "
                        "(default: 256 x the model's max_sequence_length)")


def from_args(a: argparse.Namespace) -> ServeConfig:
    port = a.port if a.port is not None else (50051 if a.transport == "grpc" else 8000)
    return ServeConfig(
        model=pathlib.Path(a.model), transport=a.transport, backend=a.backend, host=a.host, port=port,
        metrics_port=a.metrics_port, port_file=pathlib.Path(a.port_file) if a.port_file else None,
        batching=a.batching, max_batch_size=a.max_batch_size, max_batch_tokens=a.max_batch_tokens,
        max_queue_delay_ms=a.max_queue_delay_ms, max_batch_ms=a.max_batch_ms, max_queue_sequences=a.max_queue_sequences,
        max_queue_wait_seconds=a.max_queue_wait_seconds,
        max_sequences_per_request=a.max_sequences_per_request, max_request_bytes=a.max_request_bytes,
        max_queued_request_bytes=a.max_queued_request_bytes,
        intra_op_threads=a.intra_op_threads, inter_op_threads=a.inter_op_threads,
        graph_optimization_level=a.graph_optimization_level, precision=a.precision, device=a.device,
        drain_grace_seconds=a.drain_grace_seconds, warmup_rounds=a.warmup_rounds,
        max_connection_age_seconds=a.max_connection_age_seconds,
        max_connection_age_grace_seconds=a.max_connection_age_grace_seconds,
        tls_cert_file=_path("tls-cert-file", a.tls_cert_file), tls_key_file=_path("tls-key-file", a.tls_key_file),
        auth_token_file=_path("auth-token-file", a.auth_token_file),
        cost_profile=_path("cost-profile", a.cost_profile), cost_profile_seconds=a.cost_profile_seconds,
        cost_profile_dir=_profile_dir(getattr(a, "cost_profile_dir", None)),
        model_workers=parse_workers(a.model_workers),
        strip_strings=tuple(getattr(a, "strip_strings", ())), chat_template=getattr(a, "chat_template", None),
        max_text_chars=getattr(a, "max_text_chars", None),
        max_concurrent_streams=a.max_concurrent_streams, max_stream_items_in_flight=a.max_stream_items_in_flight,
        body_timeout_seconds=a.body_timeout_seconds, max_buffered_request_bytes=a.max_buffered_request_bytes,
        liveness_stall_seconds=a.liveness_stall_seconds)


def _profile_dir(value: str | None) -> pathlib.Path | None:
    if value is None:
        return cost_profile_default_dir()
    return None if value == "none" else _path("cost-profile-dir", value)


def _path(flag: str, value: str | None) -> pathlib.Path | None:
    if value == "":  # pathlib would read it as "."
        raise ConfigError(f"--{flag}: must not be empty")
    return None if value is None else pathlib.Path(value)
