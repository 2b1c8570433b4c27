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
  The threads take the callers' pieces in turn (round robin): six large requests held the shared
  pool and a normal one waited 22.6 s behind them; now it waits for the pieces running.
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
from collections import deque
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
    check_char_count(len(text), cap, where)


def check_char_count(n: int, cap: int, where: str) -> None:
    """`check_chars` for `n` characters counted by the caller (a conversation's messages together)."""
    if n > cap:
        raise invalid(f"{where}: {n} characters exceed max_text_chars {cap}; cut the text before sending "
                      "(or send token ids)")


#: One int object per token id, made once and shared by every request's lists (shared_ids).
_ID_OBJECTS: list[int] = []
_id_objects_lock = threading.Lock()


def shared_ids(ids: list[int]) -> list[int]:
    """`ids` with each id replaced by the one int object kept for it. `tokenizers` makes a new int for
    every id of every encoding; a large request's ids lived as long as the request while other objects
    were allocated beside them in Python's small-object arenas, and an arena is given back only when
    empty: after 4 abandoned 1024-pair /score requests py-http kept 26 extra 1 MiB arenas, +14% resident
    (docs/bench/attacks_2026-12-06.md). The ids made here die at once, in the arenas they came from.
    The table grows to the largest id seen (the vocabulary: 30,522 ints, about 1 MiB, for the default
    model); a pass over a 352-id list costs about 11 us here, `.ids` itself 5."""
    table = _ID_OBJECTS
    try:
        return [table[i] for i in ids]
    except IndexError:  # an id past the table (token ids are never negative): grow it, once
        with _id_objects_lock:
            table.extend(range(len(table), max(ids) + 1))
        return [table[i] for i in ids]


def encode_ids(tokenizer, inputs: Sequence, add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of each input (a string or a (first, second) pair), through encode_batch, which
    releases the GIL while it runs (encode does not); each id one shared int object (shared_ids)."""
    return [shared_ids(e.ids) for e in tokenizer.encode_batch(list(inputs), add_special_tokens=add_special_tokens)]


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


class _Job:
    """One caller's pieces: results by index, and how far the threads have got."""

    def __init__(self, work, loop: asyncio.AbstractEventLoop, future: asyncio.Future):
        self.work, self.loop, self.future = list(work), loop, future
        self.results: list = [None] * len(self.work)
        self.next = 0  # the first piece no thread has taken
        self.running = 0
        self.stopped = False  # cancelled, or a piece failed: no further piece starts
        self.error: BaseException | None = None

    def finish(self) -> None:
        if self.stopped and self.error is None:  # cancelled: its future is cancelled, nothing to set
            return
        outcome = self.error if self.error is not None else [x for r in self.results for x in r]
        self.loop.call_soon_threadsafe(settle, self.future, outcome)


def settle(future: asyncio.Future, outcome) -> None:
    """Sets `future`'s exception (an exception) or result (anything else), unless it is done (the
    caller cancelled): called on the event loop for work finished on another thread."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class TokenizePool:
    """TOKENIZE_THREADS threads taking pieces from the callers in turn (round robin), so a small
    request waits for the pieces running now, not for a large one's whole text."""

    def __init__(self, max_wait_s: float, threads: int = TOKENIZE_THREADS):
        self.threads = threads
        self.max_wait_s = max_wait_s  # 0: no bound (deadlines are still checked)
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
        self._jobs: deque[_Job] = deque()  # callers with pieces not yet taken, in turn
        self._closed = False
        self._chars = 0  # accepted and not yet tokenized
        self.s_per_char = SEED_S_PER_CHAR
        self._workers = [threading.Thread(target=self._work, name=f"rmscore-tokenize-{k}", daemon=True)
                         for k in range(threads)]
        for t in self._workers:
            t.start()

    def waiting_chars(self) -> int:
        """Characters accepted and not yet tokenized (pieces running included): what admission counts,
        and the gauge rmscore_tokenize_queue_characters."""
        with self._mu:
            return self._chars

    def wait_s(self, more: int = 0) -> float:
        with self._mu:
            return (self._chars + more) * self.s_per_char / self.threads

    def _queue_full(self, wait_s: float) -> ScoreError:
        return ScoreError(Code.RESOURCE_EXHAUSTED, f"queue full: about {int(wait_s * 1000)} ms of tokenizing waiting "
                                                   f"exceeds max_queue_wait_seconds ({int(self.max_wait_s * 1000)} ms)")

    def refusal_ahead(self) -> ScoreError | None:
        """The RESOURCE_EXHAUSTED any request that tokenizes gets now, whatever its size: the
        tokenizing already waiting exceeds max_queue_wait_seconds (`run` refuses it too, counting the
        request's own characters). What the HTTP front end checks before reading a body."""
        with self._mu:
            ahead = self._chars * self.s_per_char / self.threads
            if self._chars > 0 and self.max_wait_s > 0 and ahead > self.max_wait_s:
                return self._queue_full(ahead)
            return None

    def _admit_locked(self, chars: int, deadline_s: float | None) -> None:
        ahead = self._chars * self.s_per_char / self.threads
        mine = chars * self.s_per_char / self.threads
        # The request's own tokenizing counts only when it alone is not the whole wait: an idle
        # pool takes any request the caps let through (its size is bounded by them).
        if self._chars > 0 and self.max_wait_s > 0 and ahead + mine > self.max_wait_s:
            raise self._queue_full(ahead + mine)
        left = None if deadline_s is None else deadline_s - time.monotonic()
        if left is not None and ahead + mine > left:
            raise ScoreError(Code.DEADLINE_EXCEEDED,
                             f"deadline exceeded before scoring: about {int((ahead + mine) * 1000)} ms of "
                             f"tokenizing waiting, {max(0, int(left * 1000))} ms left before the deadline")
        self._chars += chars

    def _stop_locked(self, job: _Job) -> None:
        """No further piece of `job` starts; the characters of those not started are released."""
        if job.stopped:
            return
        job.stopped = True
        if job in self._jobs:
            self._jobs.remove(job)
        self._chars -= sum(n for _, n in job.work[job.next:])
        job.next = len(job.work)

    async def run(self, work: Sequence[tuple[Callable[[], list], int]], deadline_s: float | None) -> list:
        """The concatenated results of each (piece, characters) of `work`, in order. Refused
        (ScoreError) before anything runs when the tokenizing ahead is over the bounds; the pieces
        take turns with other callers'; cancelling the awaiting task stops it between pieces."""
        loop = asyncio.get_running_loop()
        job = _Job(work, loop, loop.create_future())
        with self._cv:
            self._admit_locked(sum(n for _, n in job.work), deadline_s)
            if not job.work:
                return []
            self._jobs.append(job)
            self._cv.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            with self._cv:
                self._stop_locked(job)
            raise

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                k = job.next
                job.next += 1
                if job.next < len(job.work):
                    self._jobs.append(job)  # its next piece after the other callers' next ones
                    self._cv.notify()
                job.running += 1
            piece, n = job.work[k]
            t = time.perf_counter()
            result, error = None, None
            try:
                result = piece()
            except BaseException as e:  # noqa: BLE001 - a refused text: the caller gets it
                error = e
            elapsed = time.perf_counter() - t
            with self._cv:
                job.running -= 1
                self._chars -= n
                if error is None and n >= MEASURE_MIN_CHARS:
                    self.s_per_char += ALPHA * (elapsed / n - self.s_per_char)
                if error is not None and job.error is None:
                    job.error = error
                    self._stop_locked(job)
                job.results[k] = result
                finished = job.running == 0 and job.next == len(job.work)
            if finished:
                job.finish()  # a cancelled caller's future is cancelled already: nothing is set
            # Not held while this thread waits for the next piece: an idle pool would keep the last
            # job's texts and token ids resident (core/batcher.py's loop says the same).
            job = piece = result = error = None

    def shutdown(self) -> None:
        """The threads end once no caller is left waiting (they are daemons: the exit never waits)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
