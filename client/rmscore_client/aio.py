"""asyncio clients: `AsyncRewardClient` (gRPC) and `AsyncHttpRewardClient` (the FastAPI server).

Both share the scoring logic in `_AsyncClientBase`: a rollout of any size is cut
into chunks of `chunk_size` sequences, at most `max_concurrency` chunks are in
flight at once, every chunk has a deadline (`timeout_s`, retries included), and
a chunk that fails with UNAVAILABLE or RESOURCE_EXHAUSTED is re-sent after an
exponential, jittered backoff (`retry`). Every other failure is raised at once
as a typed `RewardServerError`. Scores come back in the caller's order: each
chunk's answer is written to the chunk's own positions, so a re-sent chunk can
neither lose nor duplicate a score.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from .errors import (DeadlineExceeded, MessageTooLarge, RewardServerError, Unavailable, error_for,
                     from_rpc_error, from_status_number)
from .types import ChunkTiming, Health, ModelInfo, RetryPolicy, ScoreResult

TRUNCATIONS = ("none", "left", "right")
DEFAULT_TIMEOUT_S = 30.0

Item = Sequence[int] | tuple[str, str]


def _check_truncation(t: str) -> str:
    if t not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {t!r}")
    return t


def _check_token(token: str | None) -> str | None:
    """The shared bearer token (docs/contract.md); it travels in a header, so visible ASCII only."""
    if token is None:
        return None
    if not isinstance(token, str) or not token or any(not ("!" <= ch <= "~") for ch in token):
        # Never echo the token itself.
        raise ValueError("auth_token must be a non-empty string of printable ASCII without spaces")
    return token


def _read_ca(path: str | os.PathLike) -> bytes:
    try:
        return open(path, "rb").read()
    except OSError as e:
        raise ValueError(f"tls_ca_file: cannot read {os.fspath(path)!r}: {e.strerror}") from None


def _as_ids(seq) -> list[int]:
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
        self.truncation = _check_truncation(truncation)
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
    async def _with_retry(self, fn: Callable, timeout_s: float | None):
        """Run `fn(remaining_s)` until it succeeds, fails for good, or the deadline passes.

        Returns (result, attempts). The deadline covers every attempt and backoff."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        attempt = 0
        while True:
            attempt += 1
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DeadlineExceeded("DEADLINE_EXCEEDED", f"deadline of {timeout_s} s passed after "
                                       f"{attempt - 1} attempts", attempts=attempt - 1)
            try:
                return await fn(left), attempt
            except RewardServerError as e:
                e.attempts = attempt
                if not e.retryable or attempt >= self.retry.max_attempts:
                    raise
                pause = self.retry.backoff(attempt)
                if deadline is not None and time.monotonic() + pause >= deadline:
                    raise
                await asyncio.sleep(pause)

    async def score_ids(self, sequences: Sequence[Sequence[int]], *, truncation: str | None = None,
                        timeout_s: float | None = ..., on_chunk: Callable[[ChunkTiming], None] | None = None
                        ) -> ScoreResult:
        """Score token-id sequences (the model's own ids, special tokens included).

        `timeout_s`: deadline of each chunk, retries included (default: the client's).
        `on_chunk(timing)`: called as each chunk is answered (e.g. a progress bar)."""
        trunc = _check_truncation(truncation or self.truncation)
        timeout = self.timeout_s if timeout_s is ... else timeout_s
        seqs = [_as_ids(s) for s in sequences]
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
                (got, version, server), attempts = await self._with_retry(
                    lambda left: self._score_once(part, trunc, left), timeout)
                if len(got) != len(part):
                    raise RewardServerError("INTERNAL", f"server answered {len(got)} scores for {len(part)} "
                                            "sequences")
                scores[lo:lo + len(part)] = got
                t = ChunkTiming(lo, len(part), (time.perf_counter() - t0) * 1e3, attempts, version, *server)
                timings[k] = t
                if on_chunk is not None:
                    on_chunk(t)

        tasks = [asyncio.create_task(chunk(k)) for k in range(len(timings))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return ScoreResult([float(s) for s in scores], timings[0].model_version, list(timings))

    async def score_texts(self, prompts: Sequence[str], responses: Sequence[str], **kw) -> ScoreResult:
        """Tokenize each (prompt, response) pair with the model's tokenizer here, then score the ids."""
        return await self.score_ids(await self.tokenize(prompts, responses), **kw)

    async def _item_ids(self, item) -> list[int]:
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            return (await self.tokenize([item[0]], [item[1]]))[0]
        if isinstance(item, dict):
            if "tokens" in item:
                return _as_ids(item["tokens"])
            return (await self.tokenize([item.get("prompt", "")], [item.get("response", "")]))[0]
        return _as_ids(item)

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
        return self._stream(items, _check_truncation(truncation or self.truncation), errors, timeout_s)

    async def _stream(self, items, truncation, errors, timeout_s):  # pragma: no cover - per transport
        raise NotImplementedError
        yield

    # ---- helpers for stream implementations -------------------------------------------------
    async def _items(self, items) -> AsyncIterator[tuple[Any, list[int]]]:
        if isinstance(items, AsyncIterable):
            async for uid, x in items:
                yield uid, await self._item_ids(x)
        else:
            for uid, x in items:
                yield uid, await self._item_ids(x)


class _Reconnect(Exception):
    def __init__(self, err: RewardServerError):
        self.err = err


class _Fail:
    def __init__(self, exc: BaseException):
        self.exc = exc


_DONE = object()


async def _drain_results(results: asyncio.Queue, tasks: list[asyncio.Task]):
    try:
        while True:
            r = await results.get()
            if r is _DONE:
                return
            if isinstance(r, _Fail):
                raise r.exc
            yield r
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# =====================================================================================
# gRPC
# =====================================================================================

SERVICE_NAME = "rmscore.v1.RewardModel"


def service_config(load_balancing: str = "round_robin", health_check: bool = True) -> str:
    """gRPC service config: the channel balances over every address the target resolves to
    (`ipv4:h1:p1,h2:p2`, a DNS name with several A records, ...), and with `health_check`
    only sends to replicas whose health service says SERVING (a draining replica drops out)."""
    cfg: dict = {"loadBalancingConfig": [{load_balancing: {}}]}
    if health_check:
        cfg["healthCheckConfig"] = {"serviceName": SERVICE_NAME}
    return json.dumps(cfg)


class AsyncRewardClient(_AsyncClientBase):
    """asyncio gRPC client of the RewardModel service.

    `target`: any gRPC target: `127.0.0.1:50051`, `ipv4:127.0.0.1:5001,127.0.0.1:5002`
    (several replicas), `dns:///rm.internal:50051`. Requests are spread over the replicas by
    gRPC's own `round_robin` policy. Use one client per event loop.

    Access control (docs/contract.md): `tls=True` speaks TLS, verified against the system's
    roots or, with `tls_ca_file` (which implies `tls`), against that PEM file alone;
    `auth_token` is sent as `authorization: Bearer <token>` on every call but health. A refused
    token raises `Unauthenticated`, never retried."""

    def __init__(self, target: str, *, load_balancing: str = "round_robin", health_check: bool = True,
                 channel_options: Sequence[tuple[str, Any]] = (), tls: bool = False,
                 tls_ca_file: str | os.PathLike | None = None, auth_token: str | None = None, **kw):
        super().__init__(**kw)
        self.target = target
        self.tls = bool(tls or tls_ca_file)
        self._root_certs = _read_ca(tls_ca_file) if tls_ca_file else None
        token = _check_token(auth_token)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._options = [
            ("grpc.service_config", service_config(load_balancing, health_check)),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            # A restarted replica rejoins within ~2 s instead of gRPC's default (up to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
            ("grpc.keepalive_time_ms", 30_000),
        ]
        given = {k for k, _ in channel_options}
        self._options = [o for o in self._options if o[0] not in given] + list(channel_options)
        self._channel: grpc.aio.Channel | None = None
        self._stub = None

    def _rpc(self):
        if self._channel is None:
            from rmscore_client.v1 import reward_pb2_grpc

            if self.tls:
                creds = grpc.ssl_channel_credentials(root_certificates=self._root_certs)
                self._channel = grpc.aio.secure_channel(self.target, creds, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = reward_pb2_grpc.RewardModelStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _score_once(self, seqs, truncation, timeout_s):
        from rmscore_client.v1 import reward_pb2 as pb

        req = pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=s)) for s in seqs],
                              truncation=_TRUNC_PB[truncation])
        try:
            r = await self._rpc().Score(req, timeout=timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        t = r.timings
        return list(r.scores), r.model_version, (t.total_ms, t.inference_ms, t.queue_ms)

    async def info(self) -> ModelInfo:
        """The model behind the target (from one replica), tokenizer JSON included."""
        from rmscore_client.v1 import reward_pb2 as pb

        async def once(left):
            try:
                return await self._rpc().GetModelInfo(pb.GetModelInfoRequest(), timeout=left,
                                                      metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                raise from_rpc_error(e) from None

        m, _ = await self._with_retry(once, self.timeout_s)
        return ModelInfo(name=m.name, version=m.version, architecture=m.architecture, family=m.family,
                         pooling=m.pooling, max_sequence_length=m.max_sequence_length,
                         pad_token_id=m.pad_token_id, vocab_size=m.vocab_size,
                         max_sequences_per_request=m.max_sequences_per_request, text_format=m.text_format,
                         accepts_text=m.accepts_text, server=m.server, backend=m.backend, device=m.device,
                         tokenizer_json=m.tokenizer_json)

    async def _tokenizer_json(self) -> str:
        return (await self.info()).tokenizer_json

    async def health(self) -> Health:
        """The standard gRPC health check for the RewardModel service (one replica answers)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self._rpc()
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            r = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                                 timeout=min(self.timeout_s or 5.0, 5.0))
        except grpc.aio.AioRpcError as e:
            # With the health check on, a replica that is up but NOT_SERVING is not picked either.
            return Health(False, f"no serving replica reachable: {e.code().name}: {e.details()}")
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        return Health(status == "SERVING", status)

    async def _stream(self, items, truncation, errors, timeout_s):
        """Over ScoreStream. Items not yet answered when the stream breaks (a replica died) or
        when an item is refused as UNAVAILABLE (the replica is draining) are re-sent on a new
        stream, which the balancer places on a serving replica; an item refused as
        RESOURCE_EXHAUSTED is re-sent on the same stream after a backoff.
        Wire ids are the client's own counter, so the caller's ids may be anything."""
        from rmscore_client.v1 import reward_pb2 as pb

        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results: asyncio.Queue = asyncio.Queue()
        pending: dict[str, list] = {}  # wire id -> [caller id, pb.Sequence, attempts, first sent (monotonic)]
        item_timeout_s = self.timeout_s
        outbound: asyncio.Queue = asyncio.Queue()  # wire ids to (re)send on the current call; None wakes
        slots = asyncio.Semaphore(self.max_in_flight)
        fed = asyncio.Event()
        counter = itertools.count()

        def settle(wid: str) -> list:
            entry = pending.pop(wid)
            slots.release()
            if fed.is_set() and not pending:
                outbound.put_nowait(None)
            return entry

        async def feed() -> None:
            try:
                async for uid, ids in self._items(items):
                    await slots.acquire()
                    wid = str(next(counter))
                    pending[wid] = [uid, pb.Sequence(tokens=pb.TokenIds(ids=ids)), 1, None]
                    outbound.put_nowait(wid)
            except BaseException as e:  # the caller's iterator or the tokenizer failed
                results.put_nowait(_Fail(e))
                raise
            fed.set()
            outbound.put_nowait(None)

        async def write(call) -> None:
            try:
                while True:
                    wid = await outbound.get()
                    if wid is None:
                        if fed.is_set() and not pending:
                            await call.done_writing()
                            return
                        continue
                    entry = pending.get(wid)
                    if entry is not None:
                        if entry[3] is None:
                            entry[3] = time.monotonic()
                        await call.write(pb.ScoreStreamRequest(id=wid, sequence=entry[1],
                                                               truncation=_TRUNC_PB[truncation]))
            except (grpc.RpcError, asyncio.InvalidStateError):
                return  # the call broke: the reader sees why and opens the next one

        async def drive() -> None:
            failures = 0
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                call = self._rpc().ScoreStream(timeout=left, metadata=self._metadata)
                writer = asyncio.create_task(write(call))
                try:
                    async for resp in call:
                        entry = pending.get(resp.id)
                        if entry is None:
                            continue
                        failures = 0
                        if resp.WhichOneof("result") == "error":
                            err = from_status_number(resp.error.code, resp.error.message,
                                                     attempts=entry[2], item_id=entry[0])
                            if err.retryable and entry[2] < self.retry.max_attempts:
                                entry[2] += 1
                                if err.code == "UNAVAILABLE":  # this replica is draining: go to another
                                    raise _Reconnect(err)
                                loop.call_later(self.retry.backoff(entry[2] - 1), outbound.put_nowait, resp.id)
                                continue
                            settle(resp.id)
                            results.put_nowait(_Fail(err) if errors == "raise" else (entry[0], err))
                        else:
                            settle(resp.id)
                            results.put_nowait((entry[0], resp.score))
                    if fed.is_set() and not pending:
                        results.put_nowait(_DONE)
                        return
                    err = Unavailable("UNAVAILABLE", f"stream ended with {len(pending)} items unanswered")
                except grpc.aio.AioRpcError as e:
                    err = from_rpc_error(e)
                except _Reconnect as e:
                    err = e.err
                finally:
                    writer.cancel()
                    call.cancel()
                failures += 1
                err.attempts = failures
                self.stream_restarts += 1
                if not err.retryable or failures >= self.retry.max_attempts:
                    results.put_nowait(_Fail(err))
                    return
                await asyncio.sleep(self.retry.backoff(failures))
                while not outbound.empty():  # re-send everything unanswered on the next call
                    outbound.get_nowait()
                for wid in list(pending):
                    outbound.put_nowait(wid)
                outbound.put_nowait(None)

        async def watch() -> None:
            """Ends the stream when the oldest unanswered item has waited `item_timeout_s`: a server
            that stopped answering (hung, or stopped) leaves the call open and silent forever."""
            while True:
                sent = [e[3] for e in pending.values() if e[3] is not None]
                due = min(sent) + item_timeout_s if sent else time.monotonic() + item_timeout_s
                # At most 1 s between looks: an item sent while this sleeps is due later than `due`.
                await asyncio.sleep(min(max(due - time.monotonic(), 0.0) + 0.01, 1.0))
                late = [e for e in pending.values() if e[3] is not None and time.monotonic() - e[3] >= item_timeout_s]
                if late:
                    results.put_nowait(_Fail(DeadlineExceeded(
                        "DEADLINE_EXCEEDED", f"stream: no score for item {late[0][0]!r} within {item_timeout_s} s "
                        f"of sending it ({len(pending)} items unanswered)", attempts=late[0][2],
                        item_id=late[0][0])))
                    return

        tasks = [asyncio.create_task(feed()), asyncio.create_task(drive())]
        if item_timeout_s is not None:
            tasks.append(asyncio.create_task(watch()))
        async for r in _drain_results(results, tasks):
            yield r


def _trunc_pb():
    from rmscore_client.v1 import reward_pb2 as pb

    return {"none": pb.TRUNCATION_NONE, "left": pb.TRUNCATION_LEFT, "right": pb.TRUNCATION_RIGHT}


class _LazyTrunc(dict):
    def __missing__(self, key):
        self.update(_trunc_pb())
        return self[key]


_TRUNC_PB = _LazyTrunc()


# =====================================================================================
# HTTP (the FastAPI server)
# =====================================================================================

_HTTP_CODES = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 413: "RESOURCE_EXHAUSTED", 422: "INVALID_ARGUMENT",
               429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


class AsyncHttpRewardClient(_AsyncClientBase):
    """The same interface over the FastAPI server's JSON API (`base_url` like http://host:8000).

    `stream(...)` has no HTTP counterpart on the server: items are gathered for at most
    `linger_s` (or until `chunk_size` are waiting) and scored as small batches; a batch the
    server refuses as invalid is re-sent item by item so only the bad items fail.

    Access control: TLS is on with an https:// `base_url` (`tls=True` or `tls_ca_file`, which
    implies it, turn an http:// one into https://), verified against the system's roots or
    `tls_ca_file` alone; `auth_token` is sent as `Authorization: Bearer <token>`. A refused
    token raises `Unauthenticated`, never retried."""

    def __init__(self, base_url: str, *, headers: dict | None = None, linger_s: float = 0.002, tls: bool = False,
                 tls_ca_file: str | os.PathLike | None = None, auth_token: str | None = None, **kw):
        super().__init__(**kw)
        base_url = base_url.rstrip("/")
        if (tls or tls_ca_file) and base_url.startswith("http://"):
            base_url = "https://" + base_url[len("http://"):]
        self.base_url = base_url
        self.headers = dict(headers or {})
        token = _check_token(auth_token)
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._verify: ssl.SSLContext | bool = True
        if tls_ca_file:
            _read_ca(tls_ca_file)  # a clear error now rather than at the first call
            self._verify = ssl.create_default_context(cafile=os.fspath(tls_ca_file))
        self.linger_s = linger_s
        self._http = None

    def _client(self):
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=None,
                                           verify=self._verify,
                                           limits=httpx.Limits(max_connections=max(self.max_concurrency * 2, 10)))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _request(self, method: str, path: str, timeout_s: float | None, **kw):
        import httpx

        try:
            r = await self._client().request(method, path, timeout=None if timeout_s is None else timeout_s + 1.0,
                                             **kw)
        except httpx.TimeoutException as e:
            raise DeadlineExceeded("DEADLINE_EXCEEDED", f"{method} {path}: no answer in {timeout_s} s ({e!r})") \
                from None
        except httpx.TransportError as e:
            raise Unavailable("UNAVAILABLE", f"{method} {path}: {e!r}") from None
        if r.status_code >= 400:
            code, message = _HTTP_CODES.get(r.status_code, "UNKNOWN"), r.text[:500]
            try:
                body = r.json()["error"]
                code, message = body.get("code", code), body.get("message", message)
            except (ValueError, KeyError, TypeError):
                pass
            if r.status_code == 413:
                raise MessageTooLarge(code, message)
            raise error_for(code, message)
        return r

    async def _score_once(self, seqs, truncation, timeout_s):
        body: dict = {"sequences": [{"tokens": s} for s in seqs], "truncation": truncation}
        if timeout_s is not None:
            body["timeout_ms"] = max(timeout_s * 1e3, 1.0)
        j = (await self._request("POST", "/v1/score", timeout_s, json=body)).json()
        t = j.get("timings") or {}
        return (j["scores"], j.get("model_version", ""),
                (t.get("total_ms", 0.0), t.get("inference_ms", 0.0), t.get("queue_ms", 0.0)))

    async def info(self) -> ModelInfo:
        async def once(left):
            return (await self._request("GET", "/v1/model", left)).json()

        m, _ = await self._with_retry(once, self.timeout_s)
        fields = ModelInfo.__dataclass_fields__
        return ModelInfo(**{k: v for k, v in m.items() if k in fields})

    async def _tokenizer_json(self) -> str:
        async def once(left):
            return (await self._request("GET", "/v1/tokenizer", left)).text

        text, _ = await self._with_retry(once, self.timeout_s)
        return text

    async def health(self) -> Health:
        try:
            r = await self._client().get("/readyz", timeout=min(self.timeout_s or 5.0, 5.0))
        except Exception as e:  # noqa: BLE001 - any transport failure means "not serving"
            return Health(False, f"unreachable: {e!r}")
        status = "SERVING" if r.status_code == 200 else "NOT_SERVING"
        try:
            status = f"{status} ({r.json()['status']})"
        except (ValueError, KeyError, TypeError):
            pass
        return Health(r.status_code == 200, status)

    async def _stream(self, items, truncation, errors, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        inbox: asyncio.Queue = asyncio.Queue(maxsize=self.max_in_flight)
        results: asyncio.Queue = asyncio.Queue()
        sem = asyncio.Semaphore(self.max_concurrency)
        batches: set[asyncio.Task] = set()

        def left() -> float | None:
            return None if deadline is None else max(deadline - time.monotonic(), 1e-3)

        async def feed() -> None:
            try:
                async for uid, ids in self._items(items):
                    await inbox.put((uid, ids))
            except BaseException as e:
                results.put_nowait(_Fail(e))
                raise
            await inbox.put(_DONE)

        async def score_batch(batch) -> None:
            async with sem:
                try:
                    t = self.timeout_s if deadline is None else min(self.timeout_s or left(), left())
                    (got, _, _), _ = await self._with_retry(
                        lambda rem: self._score_once([ids for _, ids in batch], truncation, rem), t)
                    for (uid, _), s in zip(batch, got):
                        results.put_nowait((uid, s))
                    return
                except RewardServerError as e:
                    if len(batch) > 1 and e.code == "INVALID_ARGUMENT":
                        failed = e
                    else:
                        for uid, _ in batch:
                            e1 = error_for(e.code, e.message, attempts=e.attempts, item_id=uid)
                            results.put_nowait(_Fail(e1) if errors == "raise" else (uid, e1))
                        return
            # Which items are bad? Score them one by one (outside the slot held above).
            del failed
            await asyncio.gather(*(score_batch([b]) for b in batch))

        async def batcher() -> None:
            done = False
            while not done:
                first = await inbox.get()
                if first is _DONE:
                    break
                batch = [first]
                while len(batch) < self.chunk_size:
                    try:
                        nxt = await asyncio.wait_for(inbox.get(), self.linger_s)
                    except asyncio.TimeoutError:
                        break
                    if nxt is _DONE:
                        done = True
                        break
                    batch.append(nxt)
                t = asyncio.create_task(score_batch(batch))
                batches.add(t)
                t.add_done_callback(batches.discard)
            while batches:
                await asyncio.gather(*list(batches))
            results.put_nowait(_DONE)

        tasks = [asyncio.create_task(feed()), asyncio.create_task(batcher())]
        try:
            async for r in _drain_results(results, tasks):
                yield r
        finally:
            for t in list(batches):
                t.cancel()
