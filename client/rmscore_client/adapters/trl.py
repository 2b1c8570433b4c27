"""Reward functions for TRL's `GRPOTrainer` (and the trainers that share its reward interface).

TRL (checked against 1.16.0, trl/trainer/grpo_trainer.py `_calculate_rewards`) calls each entry of
`reward_funcs` as

    reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)

(`reward_kwargs`: the dataset's other columns plus `trainer_state`), expects one float or None
(read as NaN, skipped) per completion, and names the function by `__name__`. One for which
`trl.trainer.utils.is_async_callable` is true (a coroutine function, or an object with an async
`__call__`) is awaited on TRL's own event loop, concurrently with the other async reward functions.
TRL's experimental trainers OnlineDPO, SDPO and A2PO call every reward function synchronously: use
`rmscore_reward` there (an async one would hand them a coroutine; docs/frameworks/trl.md).
Prompts and completions are strings, or for conversational datasets lists of message dicts
(`[{"role": "assistant", "content": "..."}]`). A string batch is scored as TRL's own reward-model
path scores it (`_calculate_rewards` for an `nn.Module` reward): `prompt + completion` as one text,
tokenized here with the server's tokenizer without added special tokens, sent as token ids
(`string_format="pair"`: the server's `encode(prompt, completion)` with special tokens, as the
adapter scored string batches before, for a reward model trained on that pair format). A conversational batch (TRL's `is_conversational`:
the first prompt is a list of messages with a "role") is scored as TRL's own reward-model path
scores it (`_calculate_rewards` for an `nn.Module` reward): `prompt + completion` messages rendered
with the reward model's chat template, tokenized here with the server's tokenizer without added
special tokens, and sent as token ids, so every server kind scores the same ids. The template is
`chat_template=` when given (the reward model's directory, tokenizer or template), else the one the
server publishes (ModelInfo.chat_template and special_tokens, asked once at the first
conversational batch); `chat_template_kwargs=` as GRPOConfig's. With neither (a model without a
template, or a server that predates the field) the message contents are joined by blank lines and
scored as a pair, as before; a warning says so once.

Both reward objects pickle (TRL's experimental AsyncGRPOTrainer sends `reward_funcs` to a worker
process): they hold the target and options, and build their client lazily, in the process (and,
async, on the event loop) that calls them.

    from rmscore_client.adapters.trl import rmscore_reward, rmscore_async_reward
    trainer = GRPOTrainer(..., reward_funcs=[rmscore_reward("ipv4:10.0.0.1:50051,10.0.0.2:50051")])
    trainer = GRPOTrainer(..., reward_funcs=[rmscore_async_reward("10.0.0.1:50051")])
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..base import _AsyncClientBase
from ..chat import ChatTemplate
from ..errors import RewardServerError
from ..grpc_client import AsyncRewardClient
from ..http_client import AsyncHttpRewardClient
from ..sync import HttpRewardClient, RewardClient, _SyncClient

log = logging.getLogger("rmscore_client.adapters.trl")
ON_ERROR = ("raise", "none")
STRING_FORMATS = ("trl", "pair")


def message_text(x: Any) -> str:
    """A TRL prompt or completion as plain text: a string as is; a list of messages as their contents
    joined by blank lines (content may itself be a list of parts: the `text` parts count)."""
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        x = [x]
    if isinstance(x, (list, tuple)):
        parts = []
        for m in x:
            if not isinstance(m, dict):
                raise TypeError(f"expected a message dict, got {type(m).__name__}")
            c = m.get("content")
            if c is None:  # a message without text (e.g. only tool calls) is empty, not the text "None"
                c = ""
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type", "text") == "text")
            parts.append(c if isinstance(c, str) else str(c))
        return "\n\n".join(parts)
    raise TypeError(f"expected a string or a list of messages, got {type(x).__name__}")


def is_conversational(prompts) -> bool:
    """TRL's test (trl.data_utils.is_conversational) on the batch's first prompt."""
    if not prompts:
        return False
    first = prompts[0]
    return isinstance(first, list) and bool(first) and isinstance(first[0], dict) and "role" in first[0]


def _pairs(prompts, completions, format_prompt, format_completion) -> tuple[list[str], list[str]]:
    if prompts is None:
        prompts = [""] * len(completions)
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return [format_prompt(p) for p in prompts], [format_completion(c) for c in completions]


class _Reward:
    """What both reward objects share: options, formatting, scaling, the on_error choice, pickling.

    `client`: a gRPC target (`http=True`: a FastAPI base URL), built into a client with `client_kw`
    where it is called; or a ready client (then the object does not pickle). Sequences too long for
    the model are cut from the left by default (`truncation`), so one long rollout never stops
    training. `scale`/`shift` map the raw score. `on_error="none"`: a call that still fails after
    the client's retries (which by default last until its timeout_s) returns None for every
    completion, which TRL reads as NaN and leaves out, instead of raising and ending the step.
    `string_format`: "trl" (string batches scored as TRL's reward-model path: prompt + completion as
    one text, no special tokens added) or "pair" (encode(prompt, completion), special tokens added).
    `chat_template`: the reward model's template for conversational batches (anything
    `ChatTemplate.load` takes: its directory, an rmscore model repository, a transformers tokenizer,
    template text); without it, the template the server publishes; `chat_template_kwargs`: what GRPOConfig.chat_template_kwargs hands TRL's."""

    _client_attrs: tuple[str, ...] = ()

    def __init__(self, client, *, name: str = "rmscore", http: bool = False, truncation: str = "left",
                 format_prompt: Callable[[Any], str] = message_text,
                 format_completion: Callable[[Any], str] = message_text, scale: float = 1.0, shift: float = 0.0,
                 on_error: str = "raise", chat_template: Any = None, chat_template_kwargs: dict | None = None,
                 string_format: str = "trl", **client_kw):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if string_format not in STRING_FORMATS:
            raise ValueError(f"string_format must be one of {STRING_FORMATS}, got {string_format!r}")
        self.string_format = string_format
        self.chat_template = None if chat_template is None else ChatTemplate.load(chat_template)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # chat_template= wins; else the server's published template, asked once (see _needs_server_template).
        self._asked_server = chat_template is not None
        self._joined_warned = False
        self.target, self.fixed = (client, None) if isinstance(client, str) else (None, client)
        self.http, self.client_kw = http, client_kw
        self.__name__ = name
        self.truncation = truncation
        self.format_prompt, self.format_completion = format_prompt, format_completion
        self.scale, self.shift, self.on_error = scale, shift, on_error
        self.last_result = None  # the ScoreResult of the latest call (timings, model version)

    def _needs_server_template(self, prompts) -> bool:
        """A conversational batch, no chat_template= and the server not asked yet."""
        return not self._asked_server and is_conversational(prompts)

    def _adopt_server_template(self, info) -> None:
        """The template the server publishes (ModelInfo.chat_template), if any, from now on."""
        self._asked_server = True
        self.chat_template = ChatTemplate.from_model_info(info)
        if self.chat_template is not None:
            log.info("%s: conversational batches are rendered with the chat template the server publishes",
                     self.__name__)

    def _rendered(self, prompts, completions) -> list[str] | None:
        """The texts TRL's reward-model path tokenizes without special tokens: each prompt +
        completion conversation rendered with the chat template, or each string prompt + completion
        as one text; None: a pair to score as encode(prompt, completion) (string_format="pair", or a
        conversation without a template: then joined text, said once)."""
        if not is_conversational(prompts):
            if self.string_format == "pair":
                return None
            p, c = _pairs(prompts, completions, self.format_prompt, self.format_completion)
            return [a + b for a, b in zip(p, c)]
        if self.chat_template is None:
            if not self._joined_warned:
                self._joined_warned = True
                log.warning("%s: conversational prompts are scored as their contents joined by blank lines, not "
                            "rendered with the reward model's chat template as TRL's own reward-model path renders "
                            "them: the server publishes no chat template; pass chat_template= (the reward model's "
                            "directory or tokenizer) for its numbers", self.__name__)
            return None
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        texts = []
        for p, c in zip(prompts, completions):
            c = [{"role": "assistant", "content": c}] if isinstance(c, str) else list(c)
            texts.append(self.chat_template.render(list(p) + c, **self.chat_template_kwargs))
        return texts

    def _rewards(self, result) -> list[float]:
        self.last_result = result
        return [s * self.scale + self.shift for s in result.scores]

    def _failed(self, e: RewardServerError, n: int) -> list[None]:
        if self.on_error == "raise":
            raise e
        log.warning("%s: scoring %d completions failed (%s: %s); returning None for each", self.__name__, n,
                    e.code, e.message)
        return [None] * n

    def __getstate__(self):
        if self.fixed is not None:
            raise TypeError(f"{self!r} was built from a client object, which cannot be pickled; "
                            "build it from a target string to send it to another process")
        state = dict(self.__dict__)
        for attr in self._client_attrs:
            state.pop(attr, None)
        state["last_result"] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__name__!r})"


class RMScoreReward(_Reward):
    """A synchronous TRL reward function backed by a `RewardClient` (or `HttpRewardClient`); see `_Reward`."""

    _client_attrs = ("_client", "_client_pid", "_lock")

    @property
    def client(self) -> _SyncClient:
        """This process's client, built on first use (a forked or unpickled copy builds its own)."""
        if self.fixed is not None:
            return self.fixed
        if getattr(self, "_client_pid", None) != os.getpid():
            self.__dict__.setdefault("_lock", threading.Lock())
            with self._lock:
                if getattr(self, "_client_pid", None) != os.getpid():
                    self._client = (HttpRewardClient if self.http else RewardClient)(self.target, **self.client_kw)
                    self._client_pid = os.getpid()
        return self._client

    def __call__(self, prompts: Sequence | None = None, completions: Sequence = (), **kwargs) -> list:
        if not completions:
            return []
        if self._needs_server_template(prompts):
            try:
                self._adopt_server_template(self.client.info())
            except RewardServerError as e:
                return self._failed(e, len(completions))
        texts = self._rendered(prompts, completions)
        if texts is None:
            p, c = _pairs(prompts, completions, self.format_prompt, self.format_completion)
        try:
            if texts is not None:  # TRL's add_special_tokens=False (a template writes its own)
                ids = [e.ids for e in self.client.tokenizer().encode_batch(texts, add_special_tokens=False)]
                return self._rewards(self.client.score_ids(ids, truncation=self.truncation))
            return self._rewards(self.client.score_texts(p, c, truncation=self.truncation))
        except RewardServerError as e:
            return self._failed(e, len(completions))

    def close(self) -> None:
        if self.fixed is not None or getattr(self, "_client_pid", None) == os.getpid():
            self.client.close()
            self.__dict__.pop("_client_pid", None)


class RMScoreAsyncReward(_Reward):
    """An async TRL reward function (an object with an async `__call__`, which TRL's
    `is_async_callable` accepts). A gRPC aio channel belongs to one event loop, so one client is
    built per loop that awaits it (TRL's reward loop), lazily. `client` may also be a zero-argument
    factory of an async client (picklable when it is a module-level function)."""

    _client_attrs = ("_per_loop",)

    def __init__(self, client, **kw):
        super().__init__(client if isinstance(client, (str, _AsyncClientBase)) else None, **kw)
        self.factory = None if isinstance(client, (str, _AsyncClientBase)) else client
        # asyncio.iscoroutinefunction (TRL before is_async_callable, Python 3.11) reads this marker.
        if hasattr(asyncio.coroutines, "_is_coroutine"):
            self._is_coroutine = asyncio.coroutines._is_coroutine

    def client_for_loop(self) -> _AsyncClientBase:
        if self.fixed is not None:
            return self.fixed
        per_loop = self.__dict__.setdefault("_per_loop", weakref.WeakKeyDictionary())
        loop = asyncio.get_running_loop()
        c = per_loop.get(loop)
        if c is None:
            if self.factory is not None:
                c = self.factory()
            else:
                c = (AsyncHttpRewardClient if self.http else AsyncRewardClient)(self.target, **self.client_kw)
            per_loop[loop] = c
        return c

    async def __call__(self, prompts: Sequence | None = None, completions: Sequence = (), **kwargs) -> list:
        if not completions:
            return []
        if self._needs_server_template(prompts):
            try:
                self._adopt_server_template(await self.client_for_loop().info())
            except RewardServerError as e:
                return self._failed(e, len(completions))
        texts = self._rendered(prompts, completions)
        if texts is None:
            p, c = _pairs(prompts, completions, self.format_prompt, self.format_completion)
        try:
            client = self.client_for_loop()
            if texts is not None:  # TRL's add_special_tokens=False (a template writes its own)
                tok = await client.tokenizer()
                encs = await asyncio.to_thread(tok.encode_batch, texts, add_special_tokens=False)
                return self._rewards(await client.score_ids([e.ids for e in encs], truncation=self.truncation))
            return self._rewards(await client.score_texts(p, c, truncation=self.truncation))
        except RewardServerError as e:
            return self._failed(e, len(completions))

    async def aclose(self) -> None:
        """Close the client of the running loop (or the fixed one)."""
        if self.fixed is not None:
            await self.fixed.close()
            return
        c = self.__dict__.get("_per_loop", {}).pop(asyncio.get_running_loop(), None)
        if c is not None:
            await c.close()


def rmscore_reward(client: _SyncClient | str, **kw) -> RMScoreReward:
    """A synchronous reward function for `GRPOTrainer(reward_funcs=[...])`; see `_Reward`."""
    return RMScoreReward(client, **kw)


def rmscore_async_reward(client: _AsyncClientBase | str | Callable[[], _AsyncClientBase], **kw) -> RMScoreAsyncReward:
    """An async reward function for `GRPOTrainer(reward_funcs=[...])`; see `RMScoreAsyncReward`."""
    return RMScoreAsyncReward(client, **kw)


__all__ = ["RMScoreReward", "RMScoreAsyncReward", "rmscore_reward", "rmscore_async_reward", "message_text",
           "is_conversational"]
