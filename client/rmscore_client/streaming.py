"""`stream(...)`: score items as they arrive, over each transport.

A stream reads the caller's `(id, x)` items (ids may be any value; x is token ids, a
`(prompt, response)` pair or a JSONL-like dict), sends them, and yields `(id, score)`
(or `(id, error)` with `errors="yield"`) as each is answered, in any order.
`GrpcStream` rides ScoreStream; `HttpStream` gathers items into small batches, the
HTTP server having no stream.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from .errors import DeadlineExceeded, RewardServerError, Unavailable, again, from_rpc_error, from_status_number
from .policy import now, with_retry

_DONE = object()  # in `results`: the stream ended well; the caller's items, in `HttpStream.inbox`

# What grpcio's asyncio client reports, INTERNAL, when a write fails because the server has ended
# the call (grpc/_cython/_cygrpc/aio/call.pyx.pxi, set_internal_error): the server's own status (a
# draining replica's UNAVAILABLE) is lost on the client. It is never a server's status, whose
# INTERNAL details are rmscore's own ("batch failed: ..."). A CI run met it once as a replica
# drained while the client was writing.
_LOST_STATUS_DETAILS = "Internal error from Core"


def _stream_error(e: grpc.aio.AioRpcError) -> RewardServerError:
    """The error a broken ScoreStream call stands for: the call ended under a write, or cancelled
    by the other end, is read as the server having ended it (UNAVAILABLE: reopen, and send what is
    unanswered again)."""
    if e.code() == grpc.StatusCode.INTERNAL and e.details() == _LOST_STATUS_DETAILS:
        return Unavailable("UNAVAILABLE", f"the call ended while an item was being written "
                                          f"(grpc: {_LOST_STATUS_DETAILS}, the server's status lost)")
    # A call this client cancels ends in asyncio.CancelledError (grpcio checks is_locally_cancelled
    # before raising), so an AioRpcError CANCELLED is the other end's: a server shutting down cancels
    # the calls still open when its transport's grace runs out (grpc::Server::Shutdown's deadline,
    # grpc.aio's stop(grace)). A stream stays open until the client half-closes, so a draining
    # replica's stream ends this way once its accepted items are answered; a CI run met it on
    # cpp-grpc (tests/integration/test_client.py, test_stream_moves_off_a_draining_replica).
    if e.code() == grpc.StatusCode.CANCELLED:
        return Unavailable("UNAVAILABLE", f"the server cancelled the call (grpc: {e.details()}); "
                                          f"it was shutting down")
    return from_rpc_error(e)


class _Fail:
    """In `results`: the stream ends, raising `exc`."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class _Stream:
    """What both streams share: the caller's items in (`_feed`), answers out (`results`, `run`)."""

    def __init__(self, client, items, errors: str, timeout_s: float | None):
        self.client, self.items, self.errors, self.timeout_s = client, items, errors, timeout_s
        self.results: asyncio.Queue = asyncio.Queue()  # (id, score | error), a _Fail, or _DONE
        self.deadline: float | None = None  # of the whole stream; its clock starts at the first read

    def _deadline_bound(self) -> bool:
        """A deadline (the stream's, or each item's: the client's timeout_s) ends retrying anyway."""
        return self.deadline is not None or self.client.timeout_s is not None

    async def run(self) -> AsyncIterator[tuple[Any, Any]]:
        self.deadline = None if self.timeout_s is None else now() + self.timeout_s
        tasks = [asyncio.create_task(c) for c in self._tasks()]
        try:
            while True:
                r = await self.results.get()
                if r is _DONE:
                    return
                if isinstance(r, _Fail):
                    raise r.exc
                yield r
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._stop()

    def _tasks(self):
        raise NotImplementedError

    def _stop(self) -> None:
        """Cancel work that `run`'s tasks started and do not own."""

    async def _feed(self) -> None:
        try:
            async for uid, ids in self._items():
                await self._accept(uid, ids)
        except BaseException as e:  # the caller's iterator or the tokenizer failed
            self.results.put_nowait(_Fail(e))
            raise
        await self._fed()

    async def _items(self) -> AsyncIterator[tuple[Any, list[int]]]:
        if isinstance(self.items, AsyncIterable):
            async for uid, x in self.items:
                yield uid, await self.client._item_ids(x)
        else:
            for uid, x in self.items:
                yield uid, await self.client._item_ids(x)

    def _final_error(self, uid, err: RewardServerError) -> None:
        self.results.put_nowait(_Fail(err) if self.errors == "raise" else (uid, err))


class _Reconnect(Exception):
    def __init__(self, err: RewardServerError):
        self.err = err


@dataclass(eq=False)
class _Sent:
    """An item of a gRPC stream, sent and not answered yet."""

    caller_id: Any
    sequence: Any  # its pb.Sequence, kept to re-send it
    attempts: int = 1
    first_sent: float | None = None  # on the loop clock (policy.now); its timeout_s runs from here, across re-sends


class GrpcStream(_Stream):
    """Over ScoreStream. Items not yet answered when the call breaks (a replica died) or when an
    item is refused as UNAVAILABLE (the replica is draining) are re-sent on a new call, which the
    balancer places on a serving replica; an item refused as RESOURCE_EXHAUSTED is re-sent on the
    same call after a backoff. Wire ids are this stream's own counter, so the caller's ids may be
    anything. Each item must be answered within the client's `timeout_s` of first being sent."""

    def __init__(self, client, items, truncation: int, errors: str, timeout_s: float | None):
        from rmscore_client.v1 import reward_pb2

        super().__init__(client, items, errors, timeout_s)
        self.pb, self.truncation, self.retry = reward_pb2, truncation, client.retry
        self.item_timeout_s = client.timeout_s
        self.pending: dict[str, _Sent] = {}  # by wire id
        self.outbound: asyncio.Queue = asyncio.Queue()  # wire ids to (re)send on the current call; None wakes
        self.slots = asyncio.Semaphore(client.max_in_flight)
        self.fed = asyncio.Event()  # the caller's items are all read
        self.wire_ids = itertools.count()
        self.failures = 0  # calls broken in a row with no answer in between

    def _tasks(self):
        yield self._feed()
        yield self._drive()
        if self.item_timeout_s is not None:
            yield self._watch()

    async def _accept(self, uid, ids: list[int]) -> None:
        await self.slots.acquire()
        wid = str(next(self.wire_ids))
        self.pending[wid] = _Sent(uid, self.pb.Sequence(tokens=self.pb.TokenIds(ids=ids)))
        self.outbound.put_nowait(wid)

    async def _fed(self) -> None:
        self.fed.set()
        self.outbound.put_nowait(None)

    def _settle(self, wid: str) -> _Sent:
        sent = self.pending.pop(wid)
        self.slots.release()
        if self.fed.is_set() and not self.pending:
            self.outbound.put_nowait(None)
        return sent

    async def _write(self, call) -> None:
        """Send the items `outbound` names on `call`; half-close it once every item is answered."""
        try:
            while True:
                wid = await self.outbound.get()
                if wid is None:
                    if self.fed.is_set() and not self.pending:
                        await call.done_writing()
                        return
                    continue
                sent = self.pending.get(wid)
                if sent is not None:
                    if sent.first_sent is None:
                        sent.first_sent = now()
                    await call.write(self.pb.ScoreStreamRequest(id=wid, sequence=sent.sequence,
                                                                truncation=self.truncation))
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the call broke: the reader sees why and opens the next one

    async def _drive(self) -> None:
        """Open calls until every item is answered; a broken call is reopened after a backoff, with
        everything unanswered sent again, until `retry.max_attempts` calls broke in a row."""
        while True:
            err = await self._call()
            if err is None:
                self.results.put_nowait(_DONE)
                return
            self.failures += 1
            err.attempts = self.failures
            self.client.stream_restarts += 1
            if not err.retryable or not self.retry.retries_after(self.failures, self._deadline_bound()):
                self.results.put_nowait(_Fail(err))
                return
            await asyncio.sleep(self.retry.backoff(self.failures))
            while not self.outbound.empty():
                self.outbound.get_nowait()
            for wid in list(self.pending):
                self.outbound.put_nowait(wid)
            self.outbound.put_nowait(None)

    async def _call(self) -> RewardServerError | None:
        """One ScoreStream call, read to its end: None when every item is answered, else why it broke."""
        left = None if self.deadline is None else self.deadline - now()
        call = self.client._rpc().ScoreStream(timeout=left, metadata=self.client._metadata)
        writer = asyncio.create_task(self._write(call))
        try:
            async for resp in call:
                self._answer(resp)
            if self.fed.is_set() and not self.pending:
                return None
            return Unavailable("UNAVAILABLE", f"stream ended with {len(self.pending)} items unanswered")
        except grpc.aio.AioRpcError as e:
            return _stream_error(e)
        except _Reconnect as e:
            return e.err
        finally:
            writer.cancel()
            call.cancel()

    def _answer(self, resp) -> None:
        sent = self.pending.get(resp.id)
        if sent is None:
            return
        self.failures = 0
        if resp.WhichOneof("result") != "error":
            self._settle(resp.id)
            self.results.put_nowait((sent.caller_id, resp.score))
            return
        err = from_status_number(resp.error.code, resp.error.message, attempts=sent.attempts, item_id=sent.caller_id)
        if err.retryable and self.retry.retries_after(sent.attempts, self._deadline_bound()):
            sent.attempts += 1
            if err.code == "UNAVAILABLE":  # this replica is draining: go to another
                raise _Reconnect(err)
            asyncio.get_running_loop().call_later(self.retry.backoff(sent.attempts - 1), self.outbound.put_nowait,
                                                  resp.id)
            return
        self._settle(resp.id)
        self._final_error(sent.caller_id, err)

    async def _watch(self) -> None:
        """Ends the stream when the oldest unanswered item has waited `item_timeout_s`: a server that
        stopped answering (hung, or stopped) leaves the call open and silent forever."""
        limit = self.item_timeout_s
        while True:
            sent = [s.first_sent for s in self.pending.values() if s.first_sent is not None]
            due = min(sent) + limit if sent else now() + limit
            # At most 1 s between looks: an item sent while this sleeps is due later than `due`.
            await asyncio.sleep(min(max(due - now(), 0.0) + 0.01, 1.0))
            late = [s for s in self.pending.values()
                    if s.first_sent is not None and now() - s.first_sent >= limit]
            if late:
                self.results.put_nowait(_Fail(DeadlineExceeded(
                    "DEADLINE_EXCEEDED", f"stream: no score for item {late[0].caller_id!r} within {limit} s "
                    f"of sending it ({len(self.pending)} items unanswered)", attempts=late[0].attempts,
                    item_id=late[0].caller_id)))
                return


class HttpStream(_Stream):
    """The HTTP server has no stream: items are gathered for at most the client's `linger_s` (or
    until `chunk_size` are waiting) and scored as small batches, each under the retry and deadline
    policy; a batch the server refuses as invalid is re-sent item by item so only the bad items fail."""

    def __init__(self, client, items, truncation: str, errors: str, timeout_s: float | None):
        super().__init__(client, items, errors, timeout_s)
        self.truncation = truncation
        self.inbox: asyncio.Queue = asyncio.Queue(maxsize=client.max_in_flight)  # (id, ids), then _DONE
        self.slots = asyncio.Semaphore(client.max_concurrency)
        self.batches: set[asyncio.Task] = set()

    def _tasks(self):
        yield self._feed()
        yield self._gather()

    def _stop(self) -> None:
        for t in list(self.batches):
            t.cancel()

    async def _accept(self, uid, ids: list[int]) -> None:
        await self.inbox.put((uid, ids))

    async def _fed(self) -> None:
        await self.inbox.put(_DONE)

    async def _gather(self) -> None:
        done = False
        while not done:
            first = await self.inbox.get()
            if first is _DONE:
                break
            batch = [first]
            while len(batch) < self.client.chunk_size:
                try:
                    nxt = await asyncio.wait_for(self.inbox.get(), self.client.linger_s)
                except asyncio.TimeoutError:
                    break
                if nxt is _DONE:
                    done = True
                    break
                batch.append(nxt)
            t = asyncio.create_task(self._score(batch))
            self.batches.add(t)
            t.add_done_callback(self.batches.discard)
        while self.batches:
            await asyncio.gather(*list(self.batches))
        self.results.put_nowait(_DONE)

    def _left(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - now(), 1e-3)

    async def _score(self, batch: list[tuple[Any, list[int]]]) -> None:
        client = self.client
        async with self.slots:
            try:
                t = client.timeout_s if self.deadline is None else min(client.timeout_s or self._left(), self._left())
                (got, _, _), _ = await with_retry(
                    lambda rem: client._score_once([ids for _, ids in batch], self.truncation, rem), t, client.retry)
                if len(got) != len(batch):  # as score_ids checks: zip would drop the last items unanswered
                    raise RewardServerError("INTERNAL", f"server answered {len(got)} scores for {len(batch)} "
                                                        "sequences")
                for (uid, _), s in zip(batch, got):
                    self.results.put_nowait((uid, s))
                return
            except RewardServerError as e:
                if len(batch) == 1 or e.code != "INVALID_ARGUMENT":
                    for uid, _ in batch:
                        self._final_error(uid, again(e, item_id=uid))
                    return
        # Which items are bad? Score them one by one (outside the slot held above).
        await asyncio.gather(*(self._score([b]) for b in batch))
