"""verl's custom reward function interface, driven the way verl drives it (read at volcengine/verl
b178a3cd, 0.8.0.dev; the same functions and calls in verl 0.9.1), without verl installed: over both
transports and on event loops one after the other. test_frameworks_verl_package.py runs verl 0.9.1
itself, from PyPI, on the command lines of docs/frameworks/verl.md.

- loading: `custom_reward_function.path: pkg://rmscore_client.adapters.verl` goes through
  verl.utils.import_utils.load_module (`importlib.import_module` of the part after pkg://), then
  verl.trainer.ppo.reward.get_custom_reward_fn binds `reward_kwargs` with functools.partial over
  `_call_with_kwargs` (sync) or `_call_with_kwargs_async` (async);
- calling: workers/reward_manager/naive.py calls it per sample with data_source, solution_str,
  ground_truth, extra_info; the reward loop (experimental/reward_loop/reward_manager/naive.py) awaits
  it when `inspect.iscoroutinefunction` says so, else runs it in the loop's default executor.

These few lines are its calling convention (verl/trainer/ppo/reward.py and the naive managers).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect

import pytest

from test_client import GRPC_KINDS, HTTP_KIND, assert_scores, local_tokenizer, ort_scores, shared_server

SAMPLES = [  # (extra_info as verl's GSM8K preprocessing writes it, response)
    ({"split": "train", "index": 0, "answer": "4", "question": "What is 2 + 2?"}, "It is 4."),
    ({"split": "train", "index": 1, "answer": "7", "question": "Name a prime number."}, "Seven."),
    ({"index": 2, "prompt": [{"role": "user", "content": "Why is the sky blue?"}]}, "Rayleigh scattering."),
]


def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


async def _call_with_kwargs_async(raw_fn, extra_kwargs, *args, **kwargs):
    return await raw_fn(*args, **{**kwargs, **extra_kwargs})


def get_custom_reward_fn(path: str, name: str, reward_kwargs: dict):
    module = importlib.import_module(path.removeprefix("pkg://").replace("/", "."))
    raw_fn = getattr(module, name)
    wrap = _call_with_kwargs_async if inspect.iscoroutinefunction(raw_fn) else _call_with_kwargs
    return functools.partial(wrap, raw_fn, dict(reward_kwargs))


async def reward_loop_run_single(compute_score, extra_info, response):
    """The reward loop's call of one sample (what surrounds it in verl decodes the response)."""
    kw = dict(data_source="openai/gsm8k", solution_str=response, ground_truth=extra_info.get("answer"),
              extra_info={**extra_info, "num_turns": None, "rollout_reward_scores": {}})
    if inspect.iscoroutinefunction(compute_score):
        return await compute_score(**kw)
    return await asyncio.get_running_loop().run_in_executor(None, lambda: compute_score(**kw))


def reference() -> list[float]:
    prompts = ["What is 2 + 2?", "Name a prime number.", "Why is the sky blue?"]
    return ort_scores([local_tokenizer().encode(p, r).ids for p, (_, r) in zip(prompts, SAMPLES)])


@pytest.fixture(scope="module")
def targets():
    return {"grpc": shared_server(GRPC_KINDS[0]).target, "http": shared_server(HTTP_KIND).base_url}


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_naive_reward_manager_calls_compute_score(targets, transport):
    fn = get_custom_reward_fn("pkg://rmscore_client.adapters.verl", "compute_score",
                              {"target": targets[transport], "http": transport == "http"})
    got = [fn(data_source="openai/gsm8k", solution_str=r, ground_truth=info.get("answer"), extra_info=dict(info))
           for info, r in SAMPLES]
    # What verl's naive manager reads: result["score"] as the reward, every key logged under its name.
    assert all(set(x) == {"score", "rm_score", "rm_prompt_missing"} and x["rm_prompt_missing"] == 0.0 for x in got)
    assert_scores([x["score"] for x in got], reference())
    assert [x["rm_score"] for x in got] == [x["score"] for x in got]


@pytest.mark.parametrize("name", ["compute_score_async", "compute_score"])
def test_reward_loop_awaits_or_offloads_it(targets, name):
    fn = get_custom_reward_fn("pkg://rmscore_client.adapters.verl", name, {"target": targets["grpc"]})
    assert inspect.iscoroutinefunction(fn) == name.endswith("_async")

    async def batch():
        return await asyncio.gather(*(reward_loop_run_single(fn, info, r) for info, r in SAMPLES))

    # Two event loops one after the other (verl's reward workers each have their own): each gets a
    # client of its own, so a channel of a closed loop is never reused.
    assert_scores([x["score"] for x in asyncio.run(batch())], reference())
    assert_scores([x["score"] for x in asyncio.run(batch())], reference())


def test_sample_without_prompt_is_scored_as_its_response_or_refused_by_choice(targets, caplog):
    """verl's full_hh_rlhf, math_dataset and hellaswag preprocessing put no prompt in extra_info, and
    verl's reward loop does not catch an exception: such a sample is scored as the response alone
    (before: ValueError at the first sample, training stopped), said once in the log and per sample."""
    from rmscore_client.adapters import verl

    fn = get_custom_reward_fn("pkg://rmscore_client.adapters.verl", "compute_score", {"target": targets["grpc"]})
    verl._warned = False
    with caplog.at_level("WARNING", logger="rmscore_client.verl"):
        got = [fn(data_source="Dahoas/full-hh-rlhf", solution_str="a response", ground_truth=None,
                  extra_info={"split": "train", "index": i}) for i in range(2)]
    assert [r.levelname for r in caplog.records].count("WARNING") == 1 and "no prompt" in caplog.text
    want = ort_scores([local_tokenizer().encode("a response").ids])[0]
    assert all(x["rm_prompt_missing"] == 1.0 for x in got)
    assert_scores([x["score"] for x in got], [want, want])
    with pytest.raises(ValueError, match="extra_info has no prompt"):
        verl.compute_score("src", "a response", None, {"index": 3}, target=targets["grpc"], missing_prompt="error")
    assert verl.compute_score("src", "It is 4.", None, {"q": "What is 2 + 2?"}, target=targets["grpc"],
                              prompt_key="q", return_float=True) == pytest.approx(reference()[0], abs=1e-4)
