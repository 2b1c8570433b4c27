"""verl custom reward functions backed by rmscore: `compute_score` (sync) and `compute_score_async`.

verl (run as verl 0.9.1 from PyPI by tests/integration/test_frameworks_verl_package.py; first read at
volcengine/verl b178a3cd, 0.8.0.dev; docs/frameworks/verl.md) loads a custom reward function
(`reward.custom_reward_function.path` / `.name` since 0.9.0, top-level `custom_reward_function`
before), binds its `reward_kwargs` to it, and its reward managers call it once per sample as

    compute_score(data_source=..., solution_str=response, ground_truth=..., extra_info=..., **reward_kwargs)

in 0.9.1 from its reward workers (experimental/reward_loop/reward_manager/naive.py): the sync one in
an executor thread, the async one (`inspect.iscoroutinefunction`) awaited on the worker's event loop.
verl passes the decoded response only: the prompt comes from the sample's `extra_info`
(verl's own data preprocessing stores it there, e.g. `extra_info["question"]` for GSM8K), under
`prompt_key`, or the first of PROMPT_KEYS present. verl's own reward-model example (full_hh_rlhf)
and others store none, and verl's reward loop does not catch an exception, so a sample without a
prompt is scored as its response alone (`missing_prompt: response`, the default), said once per
process in the log and per sample as `rm_prompt_missing` 1.0 in what verl logs; with
`missing_prompt: error` it raises ValueError instead.

The return is a dict, `{"score": reward, "rm_score": reward, "rm_prompt_missing": 0.0 or 1.0}`:
verl rewards with `score` and logs every key under its name (a float would be logged as `acc`).
`return_float: true` returns the reward alone.

reward_kwargs (all optional but the target):
    target: gRPC target, or the FastAPI base URL with http: true (default: $RMSCORE_TARGET)
    http: false; prompt_key: null; missing_prompt: response; truncation: left; timeout_s: 30;
    scale: 1.0; shift: 0.0; return_float: false

Clients are built lazily and reused: one per process for the sync function, one per event loop
for the async one (a gRPC aio channel belongs to the loop it was made on).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from typing import Any

from ..grpc_client import AsyncRewardClient
from ..http_client import AsyncHttpRewardClient
from ..sync import HttpRewardClient, RewardClient
from .trl import message_text

PROMPT_KEYS = ("prompt", "question", "problem")

_sync_clients: dict[tuple, Any] = {}
_sync_lock = threading.Lock()
_loop_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


MISSING_PROMPT = ("response", "error")
_log = logging.getLogger("rmscore_client.verl")
_warned = False


def prompt_of(extra_info: dict | None, prompt_key: str | None = None, missing_prompt: str = "error") -> str | None:
    """The sample's prompt text from verl's `extra_info` (a string or a list of chat messages). None
    when it has none and `missing_prompt` is "response" (logged once per process); else ValueError."""
    global _warned
    if missing_prompt not in MISSING_PROMPT:
        raise ValueError(f"reward_kwargs.missing_prompt: must be one of {MISSING_PROMPT}, got {missing_prompt!r}")
    info = extra_info or {}
    keys = (prompt_key,) if prompt_key else PROMPT_KEYS
    for k in keys:
        if info.get(k) is not None:
            return message_text(info[k])
    why = (f"extra_info has no prompt under {' or '.join(map(repr, keys))} (keys: {sorted(info)}); "
           "store the prompt there in the data preprocessing, or set reward_kwargs.prompt_key")
    if missing_prompt == "error":
        raise ValueError(why)
    if not _warned:
        _warned = True
        _log.warning("rmscore: %s. Scoring such samples as the response alone (rm_prompt_missing 1.0 in verl's "
                     "logs); reward_kwargs.missing_prompt: error refuses them instead", why)
    return None


def _result(reward: float, prompt: str | None, return_float: bool) -> float | dict:
    if return_float:
        return reward
    return {"score": reward, "rm_score": reward, "rm_prompt_missing": 0.0 if prompt is not None else 1.0}


def _target(target: str | None) -> str:
    t = target or os.environ.get("RMSCORE_TARGET")
    if not t:
        raise ValueError("no rmscore server: set custom_reward_function.reward_kwargs.target or $RMSCORE_TARGET")
    return t


def _sync_client(target: str, http: bool, timeout_s: float):
    key = (os.getpid(), target, http, timeout_s)
    with _sync_lock:
        c = _sync_clients.get(key)
        if c is None:
            c = _sync_clients[key] = (HttpRewardClient if http else RewardClient)(target, timeout_s=timeout_s)
        return c


def _async_client(target: str, http: bool, timeout_s: float):
    per_loop = _loop_clients.setdefault(asyncio.get_running_loop(), {})
    key = (target, http, timeout_s)
    c = per_loop.get(key)
    if c is None:
        c = per_loop[key] = (AsyncHttpRewardClient if http else AsyncRewardClient)(target, timeout_s=timeout_s)
    return c


def compute_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                  extra_info: dict | None = None, *, target: str | None = None, http: bool = False,
                  prompt_key: str | None = None, missing_prompt: str = "response", truncation: str = "left",
                  timeout_s: float = 30.0, scale: float = 1.0, shift: float = 0.0, return_float: bool = False,
                  **_verl_kwargs) -> float | dict:
    """The reward of `solution_str` for the prompt in `extra_info` (the module docstring says what is
    returned). verl's other arguments (data_source, ground_truth, reward_router_address, ...) are
    accepted and unused."""
    prompt = prompt_of(extra_info, prompt_key, missing_prompt)
    client = _sync_client(_target(target), http, timeout_s)
    if prompt is None:
        ids = client.tokenizer().encode(solution_str).ids
        r = client.score_ids([ids], truncation=truncation)
    else:
        r = client.score_texts([prompt], [solution_str], truncation=truncation)
    return _result(r.scores[0] * scale + shift, prompt, return_float)


async def compute_score_async(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                              extra_info: dict | None = None, *, target: str | None = None, http: bool = False,
                              prompt_key: str | None = None, missing_prompt: str = "response",
                              truncation: str = "left", timeout_s: float = 30.0, scale: float = 1.0,
                              shift: float = 0.0, return_float: bool = False, **_verl_kwargs) -> float | dict:
    """`compute_score` for verl's async reward loop: awaited there, on a client of that loop."""
    prompt = prompt_of(extra_info, prompt_key, missing_prompt)
    client = _async_client(_target(target), http, timeout_s)
    if prompt is None:
        ids = (await client.tokenizer()).encode(solution_str).ids
        r = await client.score_ids([ids], truncation=truncation)
    else:
        r = await client.score_texts([prompt], [solution_str], truncation=truncation)
    return _result(r.scores[0] * scale + shift, prompt, return_float)


__all__ = ["compute_score", "compute_score_async", "prompt_of", "PROMPT_KEYS"]
