"""Benchmark presets: every knob of a run, with three sizes (tiny, short, full)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from rmscore_tools.kinds import ALL_KINDS, KINDS, RUNTIMES

BACKEND_OF = {name: k.runtime for name, k in KINDS.items()}
MODES = ("isolated", "contended")
BATCHING = ("length_aware", "fifo", "cost_aware")
ABLATION_POLICIES = ("no_batching", "fifo_fixed", "token_budget", "length_aware")


@dataclass(frozen=True)
class Settings:
    preset: str
    kinds: tuple[str, ...]
    batching: tuple[str, ...]
    modes: tuple[str, ...]
    repeats: int
    warmup_s: float
    settle_s: float
    window_s: float
    concurrency: tuple[int, ...]
    open_rate_seq_s: float
    max_outstanding: int
    chunk_size: int
    rollout_size: int
    rollouts_per_rep: int
    lengths: str
    inproc_runtimes: tuple[str, ...]
    inproc_repeats: int
    ablation: bool
    ablation_backend: str
    ablation_rollout_size: int
    ablation_repeats: int
    intra_op_threads: int = 2
    inter_op_threads: int = 1
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_queue_delay_ms: float = 2.0
    parity_set_size: int = 32
    overhead_sequences: int = 512  # `--overhead`: sequences cut into full batches
    seed: int = 20240601
    server_ready_timeout_s: float = 600.0
    rpc_timeout_s: float = 120.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict:
        return asdict(self)

    def with_(self, **kw) -> "Settings":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def server_flags(self, batching: str) -> dict:
        """Identical for every kind: the comparison holds threads and batching knobs equal."""
        return {"batching": batching, "max_batch_size": self.max_batch_size, "max_batch_tokens": self.max_batch_tokens,
                "max_queue_delay_ms": self.max_queue_delay_ms, "intra_op_threads": self.intra_op_threads,
                "inter_op_threads": self.inter_op_threads}


PRESETS = {
    # Seconds of measuring (server start-up dominates): for tests of the machinery, not for numbers.
    "tiny": Settings(
        preset="tiny", kinds=("py-grpc-onnxruntime",), batching=("length_aware",), modes=("isolated",),
        repeats=2, warmup_s=1.0, settle_s=0.5, window_s=3.0, concurrency=(1, 2), open_rate_seq_s=4.0,
        max_outstanding=16, chunk_size=4, rollout_size=16, rollouts_per_rep=1, lengths="lognormal:48:0.5:16:128",
        inproc_runtimes=("onnxruntime",), inproc_repeats=2, ablation=True, ablation_backend="onnxruntime",
        ablation_rollout_size=24, ablation_repeats=2, parity_set_size=8, overhead_sequences=72),
    # A few minutes per server kind: every kind but torch.compile (2 min warm-up per start), both modes.
    "short": Settings(
        preset="short", kinds=("cpp-grpc", "py-grpc-onnxruntime", "py-grpc-eager", "py-http-onnxruntime"),
        batching=("cost_aware",), modes=("isolated", "contended"), repeats=3, warmup_s=3.0, settle_s=1.0,
        window_s=6.0, concurrency=(1, 4, 16), open_rate_seq_s=8.0, max_outstanding=64, chunk_size=8,
        rollout_size=64, rollouts_per_rep=2, lengths="lognormal:160:0.6:32:512",
        inproc_runtimes=("onnxruntime", "eager"), inproc_repeats=3, ablation=True, ablation_backend="onnxruntime",
        ablation_rollout_size=128, ablation_repeats=3),
    # The real run: every kind, both batching policies, both modes, K=5.
    "full": Settings(
        preset="full", kinds=ALL_KINDS, batching=("cost_aware", "length_aware", "fifo"), modes=("isolated", "contended"),
        repeats=5, warmup_s=10.0, settle_s=2.0, window_s=30.0, concurrency=(1, 2, 4, 8, 16, 32),
        open_rate_seq_s=16.0, max_outstanding=128, chunk_size=16, rollout_size=256, rollouts_per_rep=3,
        lengths="lognormal:160:0.6:32:512", inproc_runtimes=RUNTIMES, inproc_repeats=5, ablation=True,
        ablation_backend="onnxruntime", ablation_rollout_size=256, ablation_repeats=5),
}
