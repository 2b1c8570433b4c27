"""Reward functions for TRL's `GRPOTrainer` (and the trainers that share its reward interface).

TRL calls each entry of `reward_funcs` as

    reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)

(`reward_kwargs`: the dataset's other columns plus `trainer_state`) and expects one float per
completion; it names the function by `__name__`. A function that `asyncio.iscoroutinefunction`
recognizes is awaited on TRL's own event loop, concurrently with the other async reward
functions. Prompts and completions are strings, or for conversational datasets lists of
message dicts (`[{"role": "assistant", "content": "..."}]`); the contents are joined.

    from rmscore_client.adapters.trl import rmscore_reward, rmscore_async_reward
    trainer = GRPOTrainer(..., reward_funcs=[rmscore_reward("ipv4:10.0.0.1:50051,10.0.0.2:50051")])
    trainer = GRPOTrainer(..., reward_funcs=[rmscore_async_reward("10.0.0.1:50051")])
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..base import _AsyncClientBase
from ..grpc_client import AsyncRewardClient
from ..http_client import AsyncHttpRewardClient
from ..sync import HttpRewardClient, RewardClient, _SyncClient


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
            c = m.get("content", "")
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type", "text") == "text")
            parts.append(c if isinstance(c, str) else str(c))
        return "\n\n".join(parts)
    raise TypeError(f"expected a string or a list of messages, got {type(x).__name__}")


def _pairs(prompts, completions, format_prompt, format_completion) -> tuple[list[str], list[str]]:
    if prompts is None:
        prompts = [""] * len(completions)
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return [format_prompt(p) for p in prompts], [format_completion(c) for c in completions]


class RMScoreReward:
    """A synchronous TRL reward function backed by a `RewardClient` (or `HttpRewardClient`).

    `client`: a client, or a gRPC target (`http=True`: a FastAPI base URL) to build one with
    `client_kw`. Sequences too long for the model are cut from the left by default (`truncation`),
    so one long rollout never stops training. `scale`/`shift` map the raw score."""

    def __init__(self, client: _SyncClient | str, *, name: str = "rmscore", http: bool = False,
                 truncation: str = "left", format_prompt: Callable[[Any], str] = message_text,
                 format_completion: Callable[[Any], str] = message_text, scale: float = 1.0, shift: float = 0.0,
                 **client_kw):
        if isinstance(client, str):
            client = (HttpRewardClient if http else RewardClient)(client, **client_kw)
        self.client = client
        self.__name__ = name
        self.truncation = truncation
        self.format_prompt, self.format_completion = format_prompt, format_completion
        self.scale, self.shift = scale, shift
        self.last_result = None  # the ScoreResult of the latest call (timings, model version)

    def __call__(self, prompts: Sequence | None = None, completions: Sequence = (), **kwargs) -> list[float]:
        p, c = _pairs(prompts, completions, self.format_prompt, self.format_completion)
        if not c:
            return []
        self.last_result = r = self.client.score_texts(p, c, truncation=self.truncation)
        return [s * self.scale + self.shift for s in r.scores]

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"RMScoreReward({self.__name__!r})"


def rmscore_reward(client: _SyncClient | str, **kw) -> RMScoreReward:
    """A synchronous reward function for `GRPOTrainer(reward_funcs=[...])`; see `RMScoreReward`."""
    return RMScoreReward(client, **kw)


def rmscore_async_reward(client: _AsyncClientBase | str | Callable[[], _AsyncClientBase], *,
                         name: str = "rmscore", http: bool = False, truncation: str = "left",
                         format_prompt: Callable[[Any], str] = message_text,
                         format_completion: Callable[[Any], str] = message_text, scale: float = 1.0,
                         shift: float = 0.0, **client_kw):
    """An async reward function (a real coroutine function, as TRL's `asyncio.iscoroutinefunction`
    check needs) for `GRPOTrainer(reward_funcs=[...])`.

    `client`: a gRPC target (`http=True`: a FastAPI base URL), or a zero-argument factory of an
    async client. A gRPC aio channel belongs to one event loop, so the client is built lazily on
    the loop that awaits the function (TRL's reward loop), once per loop."""
    if isinstance(client, _AsyncClientBase):
        fixed = client
        factory = None
    else:
        fixed = None
        if isinstance(client, str):
            cls = AsyncHttpRewardClient if http else AsyncRewardClient
            factory = functools.partial(cls, client, **client_kw)
        else:
            factory = client
    per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def client_for_loop() -> _AsyncClientBase:
        if fixed is not None:
            return fixed
        loop = asyncio.get_running_loop()
        c = per_loop.get(loop)
        if c is None:
            c = per_loop[loop] = factory()
        return c

    async def reward(prompts: Sequence | None = None, completions: Sequence = (), **kwargs) -> list[float]:
        p, c = _pairs(prompts, completions, format_prompt, format_completion)
        if not c:
            return []
        r = await client_for_loop().score_texts(p, c, truncation=truncation)
        reward.last_result = r
        return [s * scale + shift for s in r.scores]

    async def aclose() -> None:
        for c in list(per_loop.values()) + ([fixed] if fixed else []):
            await c.close()

    reward.__name__ = reward.__qualname__ = name
    reward.last_result = None
    reward.client_for_loop = client_for_loop
    reward.aclose = aclose
    return reward


__all__ = ["RMScoreReward", "rmscore_reward", "rmscore_async_reward", "message_text"]
