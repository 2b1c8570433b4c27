"""Typed results and options of the rmscore client."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


#: Attempts of a call without a deadline under the default RetryPolicy (max_attempts=None).
UNBOUNDED_ATTEMPTS = 5


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, only for UNAVAILABLE and RESOURCE_EXHAUSTED.

    Attempt k (1-based) that failed retryably waits `uniform(0, min(max_backoff_s,
    initial_backoff_s * multiplier**(k-1)))` before the next. `max_attempts=1` turns
    retries off; None (the default) retries until the call's deadline, so a replica restarting
    (3-12 s here) within the call's timeout_s is waited out, or UNBOUNDED_ATTEMPTS times when the call
    has no deadline. Scoring is idempotent, so re-sending a chunk is always safe: its
    scores land in the same positions whichever attempt answers.
    """

    max_attempts: int | None = None
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self):
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError(f"bad backoff: {self}")

    def retries_after(self, failed_attempt: int, deadline_bound: bool) -> bool:
        """Whether attempt `failed_attempt` (1-based), which failed retryably, may be followed by another;
        `deadline_bound`: a deadline ends the call anyway."""
        limit = self.max_attempts if self.max_attempts is not None else None if deadline_bound else UNBOUNDED_ATTEMPTS
        return limit is None or failed_attempt < limit

    def backoff(self, failed_attempt: int) -> float:
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (failed_attempt - 1))
        return random.uniform(0, cap)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class ChunkTiming:
    """One chunk (one Score request) of a `score_*` call."""

    offset: int  # index of the chunk's first sequence in the caller's list
    count: int
    latency_ms: float  # client-side: first send until the answer, retries and backoff included
    attempts: int
    model_version: str
    # The server's own measurement of the attempt that answered (see reward.proto Timings).
    total_ms: float
    inference_ms: float
    queue_ms: float


@dataclass(frozen=True)
class ScoreResult:
    """Scores in the caller's order, the model version that made them, and per-chunk timings."""

    scores: list[float]
    model_version: str
    timings: list[ChunkTiming] = field(default_factory=list)

    @property
    def model_versions(self) -> set[str]:
        """Every version that answered a chunk: more than one means a model changed mid-rollout."""
        return {t.model_version for t in self.timings} or {self.model_version}

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    architecture: str
    family: str
    pooling: str
    max_sequence_length: int
    pad_token_id: int
    vocab_size: int
    max_sequences_per_request: int
    text_format: str
    accepts_text: bool
    server: str
    backend: str
    device: str
    tokenizer_json: str | None = field(default=None, repr=False)
    #: The reward model's chat template as the server publishes it ("": none, or a server that
    #: predates the field) and the tokenizer's named special tokens a template sees:
    #: `rmscore_client.chat.ChatTemplate.from_model_info(info)` renders with them.
    chat_template: str = field(default="", repr=False)
    special_tokens: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Health:
    serving: bool
    status: str  # "SERVING", "NOT_SERVING", or why none answered ("no serving replica reachable: ...")
