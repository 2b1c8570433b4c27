"""Admission by expected work: how long the queue will keep the model busy, and who to refuse for it.

`max_queue_sequences` counts sequences, and a sequence of 512 tokens costs ~20x one of 32 here, so
a full queue can hold minutes of model time while a one-sequence request waits behind it (a work flood:
docs/hardening.md, "A queue bounded by work"). `QueueWork` keeps the real tokens of the queued sequences and a
rate, model microseconds per real token, learnt from every batch the server runs (an exponential average, so
padding and batch sizes as this server actually runs them are in it) and seeded by a timed batch at warm-up.
The expected wait of a new request is the tokens ahead of it (queued, and in the batches running
now: a probe arriving as a 1 s batch starts waits that second too) times the rate, shared among the
model workers. A running batch counts whole until it ends: the estimate errs towards refusing,
since a request admitted on too short a wait expires in the queue instead of being refused at once.
A request is refused at once:

- RESOURCE_EXHAUSTED (`queue full: ...`, the client's Overloaded, retried with backoff) when that
  wait exceeds `--max-queue-wait-seconds`;
- DEADLINE_EXCEEDED (`deadline exceeded before scoring: ...`) when that wait plus its own batch
  exceeds the time its deadline leaves: it would expire in the queue or in its batch anyway, after
  holding its caller for nothing. Its own batch counts because a short sequence runs padded beside
  longer ones: a one-sequence probe admitted on 1.9 s of work ahead under a 2 s deadline ran out in
  its batch. The batcher bounds that batch's padded tokens (its longest sequence alone, or with
  `max_batch_size` > 1 up to `max_batch_size` x the longest of it and the queue, at most
  `max_batch_tokens`); at the rate, and at most the batch time bound, it is the batch's time.
  For a request of several sequences the deadline is held to its last sequence: the wait is the work
  that ranks before that one's turn ends, its own earlier sequences included. Held to its first, a
  flood of 80 HTTP callers each sending 16 x 512 tokens every 2 s (reliability/attacks.py,
  `streams_80_conns`) had every request accepted and then expire in the queue, turn by turn beside
  the other 79: 135 requests, none answered, and the model time spent on their first sequences lost.

Callers are served in turn (issue 29, defect 4): a caller is a connection (`CALLER`, which the front
ends set: gRPC's peer, HTTP's client address), every call and stream on it included, and the batcher
orders the queue by each caller's own work (batcher.py, "fair order"). So the work ahead of a new
request is not the whole queue but what ranks before it: the batches running, and the queued
sequences whose turn ends at or before its first sequence's would (the caller's own queued work, and
every other caller's up to there). The batcher reads that sum from its index
(`QueueIndex.tokens_through`) and hands it to `refusal`. A new caller's wait is the running batches and
the sequences that end before its own turn does (80 callers each holding a 512-token sequence at the
head are not ahead of a 16-token probe), and a caller that floods waits behind its own work and is
refused for it, alone. For the work bound only the work
ahead counts, never the request's own: an idle server accepts any valid request that its deadline
leaves time for (the sequence limits still apply), and a request larger than the bound is fed to the model a sequence at a time in its
turns, behind other callers' work. server_cpp/src/admission.{h,cc} is this file in C++, same rule and
messages; contract/batching_vectors.json's "admission" cases hold both to it.
"""

from __future__ import annotations

import contextvars
import threading

from rmscore.core.errors import Code, ScoreError

#: Who a request comes from, for the shares: its connection (gRPC `context.peer()`, HTTP `host:port` of
#: `scope["client"]`), set by the front end for the call's task (tasks and threads it starts inherit it).
#: Every call and stream on one connection is one caller. "" (unset): one anonymous caller.
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("rmscore_caller", default="")


class QueueWork:
    """Not thread-safe: the batcher holds its lock around every call."""

    #: Weight of one observed batch in the rate: about the last 5 batches count.
    ALPHA = 0.2

    def __init__(self, workers: int, max_wait_us: int, seed_us_per_token: float = 0.0, max_batch_us: int = 0):
        """`max_wait_us` 0: no bound by work (deadlines are still checked). `max_batch_us` (0: none)
        bounds a request's own batch, which a deadline must also leave time for."""
        self.workers = max(1, workers)
        self.max_wait_us = max_wait_us
        self.max_batch_us = max_batch_us
        self.tokens = 0  # real tokens of the sequences in the queue
        self.running = 0  # real tokens of the batches the workers are running
        self.us_per_token = seed_us_per_token  # 0 until seeded or observed: nothing is refused by work before
        self.by_caller: dict[str, int] = {}  # real tokens queued, per caller that has any

    def add(self, tokens: int, caller: str = "") -> None:
        self.tokens += tokens
        self.by_caller[caller] = self.by_caller.get(caller, 0) + tokens

    def remove(self, tokens: int, caller: str = "") -> None:
        self.tokens -= tokens
        left = self.by_caller.get(caller, 0) - tokens
        if left > 0:
            self.by_caller[caller] = left
        else:
            self.by_caller.pop(caller, None)

    def batch_started(self, tokens: int) -> None:
        """A batch of `tokens` real tokens left the queue (removed already) for a worker."""
        self.running += tokens

    def batch_ended(self, tokens: int) -> None:
        self.running -= tokens

    def observe(self, batch_us: float, tokens: int) -> None:
        """A batch holding `tokens` real tokens ran in `batch_us` (the first observation sets the rate)."""
        if tokens <= 0 or batch_us <= 0:
            return
        rate = batch_us / tokens
        self.us_per_token = rate if self.us_per_token == 0 else self.us_per_token + self.ALPHA * (rate - self.us_per_token)

    def wait_us(self, queued_ahead: int | None = None) -> int:
        """Expected model time, per worker, of the running batches and `queued_ahead` real tokens of the
        queue (a request's share: the batcher's `QueueIndex.tokens_through`); None: of everything queued
        (the gauge)."""
        tokens = self.running + (self.tokens if queued_ahead is None else queued_ahead)
        return int(tokens * self.us_per_token / self.workers)

    def own_batch_us(self, padded_tokens: int) -> int:
        """The time of a request's own batch of `padded_tokens` at the rate, at most the batch time bound."""
        own = int(padded_tokens * self.us_per_token)
        return min(own, self.max_batch_us) if self.max_batch_us > 0 else own

    def refusal(self, now_us: int, deadline_us: int | None, queued_ahead: int | None = None,
                own_batch_tokens: int = 0, queued_before_last: int | None = None) -> ScoreError | None:
        """Why a request arriving at `now_us` (deadline `deadline_us`, same clock) behind the running batches
        and `queued_ahead` queued real tokens (None: all of them), to run in a batch of at most
        `own_batch_tokens` padded tokens, is refused, or None. `queued_before_last`, for a request of
        several sequences: the real tokens queued that rank at or before its last sequence, plus its own
        sequences before that one (None: `queued_ahead`, a request of one sequence). The work bound reads
        what is ahead of its first sequence; its deadline, what must run before its last one ends."""
        wait = self.wait_us(queued_ahead)
        to_last = wait if queued_before_last is None else self.wait_us(queued_before_last)
        if to_last <= 0:
            return None
        if self.max_wait_us > 0 and wait > self.max_wait_us:
            return ScoreError(Code.RESOURCE_EXHAUSTED,
                              f"queue full: about {wait // 1000} ms of model work waiting exceeds "
                              f"max_queue_wait_seconds ({self.max_wait_us // 1000} ms)")
        own = self.own_batch_us(own_batch_tokens)
        if deadline_us is not None and to_last + own > deadline_us - now_us:
            if queued_before_last is None:
                waiting, batch = "model work waiting", "its own batch"
            else:
                waiting = "model work before its last sequence (its own earlier sequences included)"
                batch = "that sequence's batch"
            return ScoreError(Code.DEADLINE_EXCEEDED,
                              f"deadline exceeded before scoring: about {to_last // 1000} ms of {waiting} and up to "
                              f"{own // 1000} ms for {batch}, {max(0, deadline_us - now_us) // 1000} ms left before "
                              "the deadline")
        return None


#: What an accepted request is counted as holding (--max-queued-request-bytes): 8 bytes per token id
#: as sent, before truncation (the proto's int64, as cpp-grpc keeps them), and 1 per text character.
#: server_cpp/src/admission.h kBytesPerId is the same.
BYTES_PER_ID = 8


def request_bytes(ids: int, chars: int = 0) -> int:
    """The bytes a request with `ids` token ids and `chars` text characters is counted as holding."""
    return BYTES_PER_ID * ids + chars


class HeldBytes:
    """The bytes of accepted requests held until answered, bounded by --max-queued-request-bytes (issue 29,
    defect 1: a request is kept whole until answered while admission by work counts only the tokens that
    run, so truncated ids multiplied memory). A request that would take the total past the bound is
    refused RESOURCE_EXHAUSTED before it is queued; when nothing is held any one request is accepted, as
    an idle queue accepts any request's work. Thread-safe. server_cpp/src/admission.h HeldBytes is this
    class in C++, same rule and message."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.held = 0
        self._lock = threading.Lock()

    def hold(self, nbytes: int) -> ScoreError | None:
        """Counts `nbytes` as held and returns None, or returns the refusal and counts nothing."""
        with self._lock:
            if self.held > 0 and self.held + nbytes > self.max_bytes:
                return ScoreError(Code.RESOURCE_EXHAUSTED,
                                  f"queue full: {self.held} bytes of accepted requests held, plus this request's "
                                  f"{nbytes}, exceeds max_queued_request_bytes {self.max_bytes}")
            self.held += nbytes
            return None

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes
