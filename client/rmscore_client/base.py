"""What the gRPC and HTTP asyncio clients share: options, chunking and concurrency of
`score_*`, the model's tokenizer, and the entry to `stream(...)`.

A rollout of any size is cut into chunks of `chunk_size` sequences, at most
`max_concurrency` chunks are in flight at once, and each chunk is one call under the
retry and deadline policy (policy.py). Scores come back in the caller's order: each
chunk's answer is written to the chunk's own positions, so a re-sent chunk can
neither lose nor duplicate a score. A transport provides `_score_once`,
`_tokenizer_json`, `info`, `health`, `close` and `_stream`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from .errors import RewardServerError
from .policy import with_retry
from .types import ChunkTiming, Health, ModelInfo, RetryPolicy, ScoreResult

TRUNCATIONS = ("none", "left", "right")
DEFAULT_TIMEOUT_S = 30.0

Item = Sequence[int] | tuple[str, str]


def check_truncation(t: str) -> str:
    if t not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {t!r}")
    return t


def check_token(token: str | None) -> str | None:
    """The shared bearer token (docs/contract.md); it travels in a header, so visible ASCII only."""
    if token is None:
        return None
    if not isinstance(token, str) or not token or any(not ("!" <= ch <= "~") for ch in token):
        # Never echo the token itself.
        raise ValueError("auth_token must be a non-empty string of printable ASCII without spaces")
    return token


def read_ca(path: str | os.PathLike) -> bytes:
    try:
        return open(path, "rb").read()
    except OSError as e:
        raise ValueError(f"tls_ca_file: cannot read {os.fspath(path)!r}: {e.strerror}") from None


def as_ids(seq) -> list[int]:
    if isinstance(seq, (str, bytes)):
        raise TypeError(f"expected a sequence of token ids, got {type(seq).__name__}: {seq[:40]!r}")
    return [int(t) for t in seq]


class _AsyncClientBase:
    """What the gRPC and HTTP clients share: chunking, concurrency, deadlines, retries, tokenizer."""

    def __init__(self, *, chunk_size: int = 64, max_concurrency: int = 8, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 retry: RetryPolicy | None = None, truncation: str = "none", tokenizer: Any = None,
                 max_in_flight: int | None = None):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.chunk_size = chunk_size
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.truncation = check_truncation(truncation)
        # Stream items sent and not yet answered, at most (back-pressure on the caller's iterator).
        self.max_in_flight = max_in_flight or chunk_size * max_concurrency
        self._tokenizer_src = tokenizer  # None (fetch from the server), a tokenizer.json path, or a Tokenizer
        self._tokenizer = None
        self._tokenizer_lock: asyncio.Lock | None = None
        #: How many times a `stream(...)` was reopened after it broke (replica lost or draining).
        self.stream_restarts = 0

    # ---- what a transport provides ------------------------------------------------------
    async def _score_once(self, seqs: list[list[int]], truncation: str, timeout_s: float | None):
        """One request; returns (scores, model_version, (total_ms, inference_ms, queue_ms))."""
        raise NotImplementedError

    async def _tokenizer_json(self) -> str:
        raise NotImplementedError

    async def info(self) -> ModelInfo:
        raise NotImplementedError

    async def health(self) -> Health:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def _stream(self, items, truncation: str, errors: str, timeout_s: float | None) -> AsyncIterator:
        raise NotImplementedError

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # ---- tokenizer ------------------------------------------------------------------------
    async def tokenizer(self):
        """The model's own tokenizer (padding and truncation off, as the server uses it)."""
        if self._tokenizer is not None:
            return self._tokenizer
        if self._tokenizer_lock is None:
            self._tokenizer_lock = asyncio.Lock()
        async with self._tokenizer_lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                src = self._tokenizer_src
                if src is None:
                    tok = Tokenizer.from_str(await self._tokenizer_json())
                elif isinstance(src, (str, os.PathLike)):
                    tok = Tokenizer.from_file(os.fspath(src))
                else:
                    tok = src
                tok.no_padding()
                tok.no_truncation()
                self._tokenizer = tok
        return self._tokenizer

    async def tokenize(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[int]]:
        """`encode(prompt, response).ids` with special tokens, exactly as the Python servers tokenize text."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        for name, xs in (("prompts", prompts), ("responses", responses)):
            for i, x in enumerate(xs):
                if not isinstance(x, str):
                    raise TypeError(f"{name}[{i}]: expected str, got {type(x).__name__}")
        if not prompts:
            return []
        tok = await self.tokenizer()
        pairs = list(zip(prompts, responses))
        encs = await asyncio.to_thread(tok.encode_batch, pairs, add_special_tokens=True)
        return [e.ids for e in encs]

    # ---- scoring --------------------------------------------------------------------------
    async def score_ids(self, sequences: Sequence[Sequence[int]], *, truncation: str | None = None,
                        timeout_s: float | None = ..., on_chunk: Callable[[ChunkTiming], None] | None = None
                        ) -> ScoreResult:
        """Score token-id sequences (the model's own ids, special tokens included).

        `timeout_s`: deadline of each chunk, retries included (default: the client's).
        `on_chunk(timing)`: called as each chunk is answered (e.g. a progress bar)."""
        trunc = check_truncation(truncation or self.truncation)
        timeout = self.timeout_s if timeout_s is ... else timeout_s
        seqs = [as_ids(s) for s in sequences]
        n = len(seqs)
        scores: list[float | None] = [None] * n
        timings: list[ChunkTiming | None] = [None] * ((n + self.chunk_size - 1) // self.chunk_size)
        if n == 0:
            return ScoreResult([], "", [])
        sem = asyncio.Semaphore(self.max_concurrency)

        async def chunk(k: int) -> None:
            lo = k * self.chunk_size
            part = seqs[lo:lo + self.chunk_size]
            async with sem:
                t0 = time.perf_counter()
                (got, version, server), attempts = await with_retry(
                    lambda left: self._score_once(part, trunc, left), timeout, self.retry)
                if len(got) != len(part):
                    raise RewardServerError("INTERNAL", f"server answered {len(got)} scores for {len(part)} "
                                            "sequences")
                scores[lo:lo + len(part)] = got
                t = ChunkTiming(lo, len(part), (time.perf_counter() - t0) * 1e3, attempts, version, *server)
                timings[k] = t
                if on_chunk is not None:
                    on_chunk(t)

        if len(timings) == 1:
            # One chunk (a trainer's one-sequence request): awaited here. A task, a wait and a gather
            # around it cost ~0.2 ms of a ~14 ms call at one in flight (docs/client.md).
            await chunk(0)
        else:
            await self._all_chunks(chunk, len(timings))
        return ScoreResult([float(s) for s in scores], timings[0].model_version, list(timings))

    @staticmethod
    async def _all_chunks(chunk: Callable[[int], Awaitable[None]], count: int) -> None:
        """Runs chunk(0..count-1) at once; the first failure cancels the rest and is raised."""
        tasks = [asyncio.create_task(chunk(k)) for k in range(count)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def score_texts(self, prompts: Sequence[str], responses: Sequence[str], **kw) -> ScoreResult:
        """Tokenize each (prompt, response) pair with the model's tokenizer here, then score the ids."""
        return await self.score_ids(await self.tokenize(prompts, responses), **kw)

    async def _item_ids(self, item) -> list[int]:
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            return (await self.tokenize([item[0]], [item[1]]))[0]
        if isinstance(item, dict):
            if "tokens" in item:
                return as_ids(item["tokens"])
            return (await self.tokenize([item.get("prompt", "")], [item.get("response", "")]))[0]
        return as_ids(item)

    def stream(self, items, *, truncation: str | None = None, errors: str = "raise",
               timeout_s: float | None = None) -> AsyncIterator[tuple[Any, Any]]:
        """Score items as they arrive; yield `(id, score)` as each score is computed (any order).

        `items`: an iterable or async iterable of `(id, x)`, where x is a list of token ids, a
        `(prompt, response)` pair of strings (tokenized here), or a dict like a JSONL line. Ids
        are the caller's and may be any value. `errors="raise"`: an item the server refuses
        raises its typed error (with `.item_id`); `errors="yield"`: the error is yielded in
        place of the score and the stream goes on. Retryable failures are re-sent with backoff.
        Each item must be answered within the client's `timeout_s` (default 30 s) of being sent,
        retries included, as each chunk of `score()` must: else the stream ends with
        `DeadlineExceeded`, so a hung server cannot hang the caller.
        `timeout_s`: deadline of the whole stream (default: none)."""
        if errors not in ("raise", "yield"):
            raise ValueError(f"errors must be 'raise' or 'yield', got {errors!r}")
        return self._stream(items, check_truncation(truncation or self.truncation), errors, timeout_s)
