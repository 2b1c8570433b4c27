"""The RLHF scoring workload: rollouts of token-id sequences with a long-tailed length mix.

A trainer rank's rollout is N prompt+response sequences whose lengths are
long-tailed: most are a few hundred tokens or less, a few hit the model's
limit. The default mix is lognormal with median 160 tokens, clipped to
32..512 (the MiniLM reward model's maximum), the mix docs/machine.md measured
batching on. Token ids are random ids of the model's vocabulary framed by
[CLS] ... [SEP]; the encoder's cost depends on shape, not on which ids.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

VOCAB_SIZE = 30522
CLS_ID, SEP_ID = 101, 102
FIRST_WORD_ID = 1000  # below are [unused] and special tokens in the BERT vocabulary


@dataclass(frozen=True)
class LengthMix:
    """Sequence lengths: `kind` is lognormal (median, sigma), uniform (min..max) or fixed (median)."""

    kind: str = "lognormal"
    median: float = 160.0
    sigma: float = 0.6
    min_len: int = 32
    max_len: int = 512

    def __post_init__(self) -> None:
        if self.kind not in ("lognormal", "uniform", "fixed"):
            raise ValueError(f"length mix: kind must be lognormal, uniform or fixed, got {self.kind!r}")
        if not 2 <= self.min_len <= self.max_len:
            raise ValueError(f"length mix: need 2 <= min <= max, got min={self.min_len} max={self.max_len}")
        if self.median <= 0 or self.sigma < 0:
            raise ValueError(f"length mix: need median > 0 and sigma >= 0, got {self.median}, {self.sigma}")

    @classmethod
    def parse(cls, spec: str) -> "LengthMix":
        """`lognormal:160:0.6:32:512`, `uniform:32:512`, `fixed:128` (fields after the kind are optional)."""
        parts = spec.strip().split(":")
        kind, rest = parts[0], parts[1:]
        try:
            if kind == "lognormal":
                names, conv = ("median", "sigma", "min_len", "max_len"), (float, float, int, int)
            elif kind == "uniform":
                names, conv = ("min_len", "max_len"), (int, int)
            elif kind == "fixed":
                (n,) = rest
                return cls(kind="fixed", median=float(int(n)), min_len=int(n), max_len=int(n))
            else:
                raise ValueError
            if len(rest) > len(names):
                raise ValueError
            return cls(kind=kind, **{k: c(v) for k, c, v in zip(names, conv, rest)})
        except ValueError as e:
            if str(e).startswith("length mix"):
                raise
            raise ValueError(f"length mix {spec!r}: expected lognormal[:median[:sigma[:min[:max]]]], "
                             "uniform[:min[:max]] or fixed:N") from None

    def spec(self) -> str:
        if self.kind == "lognormal":
            return f"lognormal:{self.median:g}:{self.sigma:g}:{self.min_len}:{self.max_len}"
        if self.kind == "uniform":
            return f"uniform:{self.min_len}:{self.max_len}"
        return f"fixed:{self.min_len}"

    def describe(self) -> str:
        if self.kind == "lognormal":
            return (f"lognormal lengths, median {self.median:g} tokens, sigma {self.sigma:g}, "
                    f"clipped to {self.min_len}..{self.max_len}")
        if self.kind == "uniform":
            return f"uniform lengths {self.min_len}..{self.max_len}"
        return f"every sequence {self.min_len} tokens"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "lognormal":
            x = rng.lognormal(math.log(self.median), self.sigma, n)
        elif self.kind == "uniform":
            x = rng.uniform(self.min_len, self.max_len + 1, n)
        else:
            x = np.full(n, self.median)
        return np.clip(np.floor(x), self.min_len, self.max_len).astype(np.int64)

    def as_dict(self) -> dict:
        return asdict(self)


def make_sequence(rng: np.random.Generator, length: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    body = rng.integers(FIRST_WORD_ID, vocab_size, size=max(0, length - 2)).tolist()
    return ([CLS_ID] + body + [SEP_ID])[:length]


def make_rollout(rng: np.random.Generator, n: int, mix: LengthMix, vocab_size: int = VOCAB_SIZE) -> list[list[int]]:
    """One trainer rank's rollout: `n` sequences, lengths drawn from `mix`, in generation order."""
    return [make_sequence(rng, int(length), vocab_size) for length in mix.sample(rng, n)]


def chunks(seqs: list, size: int) -> list[list]:
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [seqs[i:i + size] for i in range(0, len(seqs), size)]


def padding_efficiency(batches: list[list[int]]) -> float:
    """Real tokens over padded tokens (batch size x longest), for batches given as lengths."""
    real = sum(sum(b) for b in batches)
    padded = sum(len(b) * max(b) for b in batches if b)
    return real / padded if padded else 1.0
