"""`AsyncHttpRewardClient`: the asyncio client of the FastAPI server's JSON API."""

from __future__ import annotations

import json
import os
import ssl

from .base import _AsyncClientBase, check_token, read_ca
from .errors import DeadlineExceeded, MessageTooLarge, Unavailable, error_for
from .policy import with_retry
from .streaming import HttpStream
from .types import Health, ModelInfo

_HTTP_CODES = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 413: "RESOURCE_EXHAUSTED", 422: "INVALID_ARGUMENT",
               429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
               504: "DEADLINE_EXCEEDED"}


#: Idle connections are dropped after this, before uvicorn's 5 s keep-alive closes them: with equal
#: limits a request could leave on a connection the server was closing (a disconnect with no answer).
KEEPALIVE_EXPIRY_S = 2.0


class _Reply:
    """An answer read whole: what the callers below use of it."""

    __slots__ = ("status_code", "content")

    def __init__(self, status_code: int, content: bytes):
        self.status_code, self.content = status_code, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


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
        token = check_token(auth_token)
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._verify: ssl.SSLContext | bool = True  # True: the system's roots
        if tls_ca_file:
            read_ca(tls_ca_file)  # a clear error now rather than at the first call
            self._verify = ssl.create_default_context(cafile=os.fspath(tls_ca_file))
        self.linger_s = linger_s
        self._http = None

    def _client(self):
        # aiohttp, not httpx: at one request in flight a bare httpx AsyncClient spent 1.61 ms of client
        # CPU a call against a bare aiohttp session's 0.57 ms, on the critical path of a ~15 ms call
        # (docs/client.md, rmscore bench --client-cost).
        if self._http is None:
            import aiohttp

            connector = aiohttp.TCPConnector(limit=max(self.max_concurrency * 2, 10),
                                             keepalive_timeout=KEEPALIVE_EXPIRY_S, ssl=self._verify)
            # No session-wide timeout (aiohttp's default is 5 min): each request carries its deadline.
            # Proxies are not read from the environment (trust_env off; httpx read them): a scoring
            # server is reached directly, and reading HTTP_PROXY/NO_PROXY and .netrc cost 0.6 ms a call.
            self._http = aiohttp.ClientSession(headers=self.headers, connector=connector,
                                               timeout=aiohttp.ClientTimeout(total=None))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _send(self, method: str, path: str, timeout_s: float | None, **kw) -> _Reply:
        """One request, its answer read whole; transport failures raise aiohttp's own errors."""
        import aiohttp

        async with self._client().request(method, self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                          **kw) as r:
            return _Reply(r.status, await r.read())

    async def _request(self, method: str, path: str, timeout_s: float | None, **kw) -> _Reply:
        import aiohttp

        try:
            r = await self._send(method, path, None if timeout_s is None else timeout_s + 1.0, **kw)
        except TimeoutError as e:  # aiohttp's timeouts are asyncio's, TimeoutError since Python 3.11
            raise DeadlineExceeded("DEADLINE_EXCEEDED", f"{method} {path}: no answer in {timeout_s} s ({e!r})") \
                from None
        except aiohttp.ClientError as e:
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
        # /rmscore/v1/score: /v1/score is the deprecated alias (vLLM clients read that path as vLLM's).
        j = (await self._request("POST", "/rmscore/v1/score", timeout_s, json=body)).json()
        t = j.get("timings") or {}
        return (j["scores"], j.get("model_version", ""),
                (t.get("total_ms", 0.0), t.get("inference_ms", 0.0), t.get("queue_ms", 0.0)))

    async def get_reward(self, queries: list[str], prompts: list[str] | None = None, labels: list | None = None) \
            -> list[float]:
        """OpenRLHF's `POST /get_reward` (docs/frameworks/openrlhf.md): one reward per query, the server
        splitting each query into prompt and response. Under the retry and deadline policy."""
        body: dict = {"query": list(queries)}
        if prompts is not None:
            body["prompts"] = list(prompts)
        if labels is not None:
            body["labels"] = list(labels)

        async def once(left):
            return await self._request("POST", "/get_reward", left, json=body)

        r, _ = await with_retry(once, self.timeout_s, self.retry)
        return [float(x) for x in r.json()["rewards"]]

    async def _get(self, path: str):
        """GET `path` under the retry and deadline policy."""
        async def once(left):
            return await self._request("GET", path, left)

        r, _ = await with_retry(once, self.timeout_s, self.retry)
        return r

    async def info(self) -> ModelInfo:
        m = (await self._get("/v1/model")).json()
        fields = ModelInfo.__dataclass_fields__
        return ModelInfo(**{k: v for k, v in m.items() if k in fields})

    async def _tokenizer_json(self) -> str:
        return (await self._get("/v1/tokenizer")).text

    async def health(self) -> Health:
        try:
            r = await self._send("GET", "/readyz", min(self.timeout_s or 5.0, 5.0))
        except Exception as e:  # noqa: BLE001 - any transport failure means "not serving"
            return Health(False, f"unreachable: {e!r}")
        status = "SERVING" if r.status_code == 200 else "NOT_SERVING"
        try:
            status = f"{status} ({r.json()['status']})"
        except (ValueError, KeyError, TypeError):
            pass
        return Health(r.status_code == 200, status)

    def _stream(self, items, truncation, errors, timeout_s):
        return HttpStream(self, items, truncation, errors, timeout_s).run()
