"""Tokenizing text: on a bounded pool, never on the event loop, counted by admission, and stopped
when its caller has gone (issue 29, defect 3; docs/contract.md, "Input bounds").

Why each part:
- `tokenizers`' `Tokenizer.encode` holds the GIL for the whole text: a 15 MiB text on /get_reward
  held it for 8 to 25 s, and a thread did not help, since the event loop needs the GIL to answer
  anyone. `encode_batch` releases it (and spreads a batch over the cores), so every text goes
  through `encode_batch`, even alone (`encode_ids`).
- A text longer than --max-text-chars is refused INVALID_ARGUMENT before anything is tokenized
  (`check_chars`), so one piece of tokenizing work is bounded (about 70 ms for the default
  model's 131,072 characters here).
- The pool has TOKENIZE_THREADS threads of its own: requests that tokenize never take the
  default executor that JSON decoding and token-id checks use, and never more threads than this.
- Admission counts tokenizing as it counts model work: the characters accepted and not yet
  tokenized, at the measured seconds per character, spread over the threads. A request that would
  wait longer than --max-queue-wait-seconds for them is refused RESOURCE_EXHAUSTED, or
  DEADLINE_EXCEEDED when its deadline comes sooner, before any of its text is tokenized.
- A request's text is tokenized in pieces of at most PIECE_CHARS characters (or one text). When
  the awaiting task is cancelled (the client disconnected or cancelled), a piece not yet started is
  never started and the pieces after the running one are dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from rmscore.core.errors import Code, ScoreError, invalid

#: --max-text-chars default: this many characters per token of the model's max_sequence_length, i.e.
#: INPUT_FACTOR (64) windows of text at 4 characters a token, the bound token ids get (validation.py).
TEXT_CHARS_PER_TOKEN = 256
#: Threads that tokenize; each runs one piece at a time, and encode_batch spreads a piece over the cores.
TOKENIZE_THREADS = 2
#: A piece of one request's tokenizing: texts are grouped up to this many characters (one text may
#: be longer, up to --max-text-chars); between pieces a cancelled request stops.
PIECE_CHARS = 1 << 18
#: The rate admission assumes before the first measurement, seconds per character: about twice
#: what encode_batch took on one core here (0.5 us), so the first estimates refuse early, not late.
SEED_S_PER_CHAR = 1e-6
#: Pieces shorter than this are not measured: their time is mostly the call's, not the characters'.
MEASURE_MIN_CHARS = 4096
ALPHA = 0.2


def default_max_text_chars(max_sequence_length: int) -> int:
    return TEXT_CHARS_PER_TOKEN * max_sequence_length


def check_chars(text: str, cap: int, where: str) -> None:
    """INVALID_ARGUMENT when `text` is longer than `cap` characters: a length check, no reading."""
    if len(text) > cap:
        raise invalid(f"{where}: {len(text)} characters exceed max_text_chars {cap}; cut the text before sending "
                      "(or send token ids)")


def encode_ids(tokenizer, inputs: Sequence, add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of each input (a string or a (first, second) pair), through encode_batch, which
    releases the GIL while it runs (encode does not)."""
    return [e.ids for e in tokenizer.encode_batch(list(inputs), add_special_tokens=add_special_tokens)]


def pieces(chars: Sequence[int], limit: int = PIECE_CHARS) -> list[range]:
    """Consecutive index ranges over texts of these lengths, each up to `limit` characters (or one text)."""
    out, start, total = [], 0, 0
    for i, n in enumerate(chars):
        if i > start and total + n > limit:
            out.append(range(start, i))
            start, total = i, 0
        total += n
    if start < len(chars):
        out.append(range(start, len(chars)))
    return out


class TokenizePool:
    def __init__(self, max_wait_s: float, threads: int = TOKENIZE_THREADS):
        self.threads = threads
        self.max_wait_s = max_wait_s  # 0: no bound (deadlines are still checked)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="rmscore-tokenize")
        self._mu = threading.Lock()
        self._chars = 0  # accepted and not yet tokenized
        self.s_per_char = SEED_S_PER_CHAR

    def wait_s(self, more: int = 0) -> float:
        with self._mu:
            return (self._chars + more) * self.s_per_char / self.threads

    def _admit(self, chars: int, deadline_s: float | None) -> None:
        with self._mu:
            ahead = self._chars * self.s_per_char / self.threads
            mine = chars * self.s_per_char / self.threads
            # The request's own tokenizing counts only when it alone is not the whole wait: an idle
            # pool takes any request the caps let through (its size is bounded by them).
            if self._chars > 0 and self.max_wait_s > 0 and ahead + mine > self.max_wait_s:
                raise ScoreError(Code.RESOURCE_EXHAUSTED,
                                 f"queue full: about {int((ahead + mine) * 1000)} ms of tokenizing waiting exceeds "
                                 f"max_queue_wait_seconds ({int(self.max_wait_s * 1000)} ms)")
            left = None if deadline_s is None else deadline_s - time.monotonic()
            if left is not None and ahead + mine > left:
                raise ScoreError(Code.DEADLINE_EXCEEDED,
                                 f"deadline exceeded before scoring: about {int((ahead + mine) * 1000)} ms of "
                                 f"tokenizing waiting, {max(0, int(left * 1000))} ms left before the deadline")
            self._chars += chars

    def _done(self, chars: int, elapsed_s: float | None) -> None:
        with self._mu:
            self._chars -= chars
            if elapsed_s is not None and chars >= MEASURE_MIN_CHARS:
                self.s_per_char += ALPHA * (elapsed_s / chars - self.s_per_char)

    async def run(self, work: Sequence[tuple[Callable[[], list], int]], deadline_s: float | None) -> list:
        """The concatenated results of each (piece, characters) of `work`, run in order on the pool.
        Refused (ScoreError) before anything runs when the tokenizing ahead is over the bounds;
        cancelling the awaiting task stops it between pieces."""
        total = sum(n for _, n in work)
        self._admit(total, deadline_s)
        stop = threading.Event()

        def run_all() -> list:
            out: list = []
            for k, (piece, n) in enumerate(work):
                if stop.is_set():  # the caller has gone: the rest is not tokenized
                    self._done(sum(m for _, m in work[k:]), None)
                    break
                t = time.perf_counter()
                try:
                    out.extend(piece())
                except BaseException:  # a refused text: this piece and the rest are not measured
                    self._done(sum(m for _, m in work[k:]), None)
                    raise
                self._done(n, time.perf_counter() - t)
            return out

        job = self._executor.submit(run_all)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            stop.set()
            if job.cancel():  # never started, and now never will: none of it was released
                self._done(total, None)
            raise

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
