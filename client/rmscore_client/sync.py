"""Synchronous clients: `RewardClient` (gRPC) and `HttpRewardClient` (FastAPI server).

Each runs its asyncio twin on a private event loop in a daemon thread, so the
synchronous and asyncio clients share one implementation of chunking,
concurrency, deadlines and retries. Safe to call from several threads at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .base import _AsyncClientBase
from .grpc_client import AsyncRewardClient
from .http_client import AsyncHttpRewardClient
from .types import Health, ModelInfo, ScoreResult

_END = object()


class _SyncClient:
    _async_cls: type[_AsyncClientBase]

    def __init__(self, *args, **kw):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rmscore-client", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._aio = self._run(self._make(args, kw))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            raise

    async def _make(self, args, kw):
        return self._async_cls(*args, **kw)

    def _run(self, coro, timeout: float | None = None):
        if self._closed:
            coro.close()
            raise RuntimeError("client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    # ---- the interface -----------------------------------------------------------------
    @property
    def chunk_size(self) -> int:
        return self._aio.chunk_size

    @property
    def max_concurrency(self) -> int:
        return self._aio.max_concurrency

    @property
    def stream_restarts(self) -> int:
        """How many times a `stream(...)` was reopened after it broke (replica lost or draining)."""
        return self._aio.stream_restarts

    def score_ids(self, sequences: Sequence[Sequence[int]], **kw) -> ScoreResult:
        """See `AsyncRewardClient.score_ids`."""
        return self._run(self._aio.score_ids(sequences, **kw))

    def score_texts(self, prompts: Sequence[str], responses: Sequence[str], **kw) -> ScoreResult:
        """See `AsyncRewardClient.score_texts`."""
        return self._run(self._aio.score_texts(prompts, responses, **kw))

    def tokenize(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[int]]:
        return self._run(self._aio.tokenize(prompts, responses))

    def tokenizer(self):
        return self._run(self._aio.tokenizer())

    def info(self) -> ModelInfo:
        return self._run(self._aio.info())

    def health(self) -> Health:
        return self._run(self._aio.health())

    def stream(self, items: Iterable[tuple[Any, Any]], **kw) -> Iterator[tuple[Any, Any]]:
        """See `AsyncRewardClient.stream`: `items` is a plain iterable here (it may block, e.g. on
        a queue of finished rollouts); it is read on its own thread."""
        out: queue.Queue = queue.Queue()
        inbox: asyncio.Queue | None = None
        ready = threading.Event()
        stop = threading.Event()

        async def bridge():
            while True:
                item = await inbox.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

        async def pump():
            nonlocal inbox
            inbox = asyncio.Queue()
            ready.set()
            try:
                async for r in self._aio.stream(bridge(), **kw):
                    out.put(("item", r))
                out.put(("end", None))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                out.put(("error", e))

        def read_items():
            ready.wait()
            try:
                for item in items:
                    if stop.is_set():
                        return
                    self._loop.call_soon_threadsafe(inbox.put_nowait, item)
                self._loop.call_soon_threadsafe(inbox.put_nowait, _END)
            except BaseException as e:  # noqa: BLE001
                self._loop.call_soon_threadsafe(inbox.put_nowait, e)

        fut = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        reader = threading.Thread(target=read_items, name="rmscore-stream-items", daemon=True)
        reader.start()
        try:
            while True:
                kind, value = out.get()
                if kind == "item":
                    yield value
                elif kind == "end":
                    return
                else:
                    raise value
        finally:
            stop.set()
            fut.cancel()

    async def _shutdown(self) -> None:
        await self._aio.close()
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._shutdown(), timeout=10)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RewardClient(_SyncClient):
    """Synchronous gRPC client.

    >>> with RewardClient("ipv4:127.0.0.1:5001,127.0.0.1:5002", chunk_size=64, max_concurrency=8) as rm:
    ...     result = rm.score_ids(rollout_ids)        # ScoreResult: .scores in the rollout's order

    Options (keyword): chunk_size=64, max_concurrency=8, timeout_s=30.0 (per chunk, retries
    included; None: no deadline), retry=RetryPolicy(...), truncation="none"|"left"|"right",
    tokenizer=None|path|tokenizers.Tokenizer, load_balancing="round_robin", health_check=True,
    channel_options=[...], tls=False, tls_ca_file=None|path (implies tls), auth_token=None|str."""

    _async_cls = AsyncRewardClient

    def __init__(self, target: str, **kw):
        super().__init__(target, **kw)

    @property
    def target(self) -> str:
        return self._aio.target


class HttpRewardClient(_SyncClient):
    """Synchronous client of the FastAPI server (`base_url` like http://127.0.0.1:8000); same
    interface and options as `RewardClient` (no load-balancing options: put a balancer in front)."""

    _async_cls = AsyncHttpRewardClient

    def __init__(self, base_url: str, **kw):
        super().__init__(base_url, **kw)

    def get_reward(self, queries: list[str], prompts: list[str] | None = None, labels: list | None = None) \
            -> list[float]:
        """See `AsyncHttpRewardClient.get_reward`."""
        return self._run(self._aio.get_reward(queries, prompts, labels))


__all__ = ["RewardClient", "HttpRewardClient"]
