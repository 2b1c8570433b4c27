"""The trainer adapters, called exactly as the trainers call them.

TRL (trl/trainer/grpo_trainer.py, `_calculate_rewards`): names each reward function by
`__name__`; a function for which `asyncio.iscoroutinefunction` is true is awaited on TRL's
own daemon event loop via `asyncio.run_coroutine_threadsafe(asyncio.gather(...))`; every
function gets `prompts=, completions=, completion_ids=, **reward_kwargs` (dataset columns
and `trainer_state`) and returns one float (or None) per completion.

OpenRLHF (openrlhf/utils/remote_rm_utils.py): `requests.post(url, json={"query": queries,
"prompts": prompts, "labels": labels}, headers={"Content-Type": "application/json"},
timeout=180)`, `raise_for_status()`, then reads `response.json()["rewards"]`.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from rmscore_client.adapters.trl import RMScoreReward, message_text, rmscore_async_reward, rmscore_reward
from test_client import GRPC_KINDS, HTTP_KIND, assert_scores, local_tokenizer, ort_scores, shared_server

PROMPTS = ["Why is the sky blue?", "Name a prime number.", "Café naïve résumé?"]
COMPLETIONS = ["Because air scatters blue light more.", "Seven.", "🙂"]


@pytest.fixture(scope="module", params=GRPC_KINDS)
def grpc_server(request):
    return shared_server(request.param)


@pytest.fixture(scope="module")
def http_server():
    return shared_server(HTTP_KIND)


def reference(prompts, completions) -> list[float]:
    """encode(prompt, completion) with special tokens: the adapter's pair format (string_format="pair",
    and a conversation without a chat template)."""
    return ort_scores([e.ids for e in local_tokenizer().encode_batch(list(zip(prompts, completions)))])


def trl_reference(prompts, completions) -> list[float]:
    """TRL 1.16's reward-model path for a string dataset: prompt + completion, no special tokens added."""
    return ort_scores([e.ids for e in local_tokenizer().encode_batch([p + c for p, c in zip(prompts, completions)],
                                                                     add_special_tokens=False)])


def trl_calculate_rewards(reward_funcs, inputs, prompts, completions, completion_ids_list):
    """TRL's calling convention (GRPOTrainer._calculate_rewards), without torch."""
    names = [f.__name__ for f in reward_funcs]
    keys = [k for k in inputs[0] if k not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs = {k: [ex[k] for ex in inputs] for k in keys}
    reward_kwargs["trainer_state"] = object()
    rewards = [None] * len(reward_funcs)
    async_funcs = []
    for i, func in enumerate(reward_funcs):
        if asyncio.iscoroutinefunction(func):
            async_funcs.append((i, func))
        else:
            out = func(prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs)
            rewards[i] = [r if r is not None else float("nan") for r in out]
    if async_funcs:
        loop = asyncio.new_event_loop()  # TRL: start_event_loop_in_daemon
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            async def invoke(i, func):
                out = await func(prompts=prompts, completions=completions, completion_ids=completion_ids_list,
                                 **reward_kwargs)
                return i, [r if r is not None else float("nan") for r in out]

            async def run_all():
                return await asyncio.gather(*(invoke(i, f) for i, f in async_funcs))

            for i, out in asyncio.run_coroutine_threadsafe(run_all(), loop).result(120):
                rewards[i] = out
            for _, f in async_funcs:  # close the clients made on TRL's loop, on that loop
                if hasattr(f, "aclose"):
                    asyncio.run_coroutine_threadsafe(f.aclose(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
    return names, rewards


def test_trl_standard_format(grpc_server):
    inputs = [{"prompt": p, "label": i} for i, p in enumerate(PROMPTS)]
    sync_f = rmscore_reward(grpc_server.target, name="rm_sync")
    async_f = rmscore_async_reward(grpc_server.target, name="rm_async")
    assert asyncio.iscoroutinefunction(async_f) and not asyncio.iscoroutinefunction(sync_f)
    try:
        names, (r_sync, r_async) = trl_calculate_rewards(
            [sync_f, async_f], inputs, PROMPTS, COMPLETIONS, [[1, 2, 3]] * len(PROMPTS))
    finally:
        sync_f.close()
    assert names == ["rm_sync", "rm_async"]
    assert all(isinstance(x, float) for x in r_sync + r_async)
    want = trl_reference(PROMPTS, COMPLETIONS)
    assert_scores(r_sync, want)
    assert_scores(r_async, want)
    pair_f = rmscore_reward(grpc_server.target, string_format="pair")
    try:
        assert_scores(pair_f(prompts=PROMPTS, completions=COMPLETIONS), reference(PROMPTS, COMPLETIONS))
    finally:
        pair_f.close()


def test_trl_conversational_format(grpc_server):
    prompts = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}] for p in PROMPTS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    inputs = [{"prompt": p} for p in prompts]
    f = RMScoreReward(grpc_server.target)
    try:
        names, (rewards,) = trl_calculate_rewards([f], inputs, prompts, completions, [[1]] * 3)
    finally:
        f.close()
    assert names == ["rmscore"]
    assert_scores(rewards, reference([f"Be brief.\n\n{p}" for p in PROMPTS], COMPLETIONS))
    assert f.last_result.model_version


def test_trl_over_http(http_server):
    f = rmscore_async_reward(http_server.base_url, http=True, name="rm_http")
    _, (rewards,) = trl_calculate_rewards([f], [{"prompt": p} for p in PROMPTS], PROMPTS, COMPLETIONS, [[1]] * 3)
    assert_scores(rewards, trl_reference(PROMPTS, COMPLETIONS))


def test_message_text():
    assert message_text("plain") == "plain"
    assert message_text([{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                           {"type": "image"}, {"type": "text", "text": "b"}]}]) == "ab"
    with pytest.raises(TypeError):
        message_text(42)


# ---- OpenRLHF ---------------------------------------------------------------------------------
def post_like_openrlhf(url, data):
    import requests

    response = requests.post(url=url, json=data, headers={"Content-Type": "application/json"}, timeout=180)
    response.raise_for_status()
    return response.json()


def test_openrlhf_get_reward(http_server):
    tok = local_tokenizer()
    # Queries as OpenRLHF makes them: the policy's padding and template around prompt + response.
    queries = [f"<pad><pad>{p} {c}</s>" for p, c in zip(PROMPTS, COMPLETIONS)]
    queries.append("A query whose prompt is not in it")
    prompts = PROMPTS + ["something else"]
    labels = ["", "7", None, 1]
    answer = post_like_openrlhf(http_server.base_url + "/get_reward",
                                {"query": queries, "prompts": prompts, "labels": labels})
    assert set(answer) == {"rewards", "scores", "extra_logs"}
    assert answer["rewards"] == answer["scores"] and answer["extra_logs"] == {}
    want_ids = [tok.encode(p, f" {c}</s>").ids for p, c in zip(PROMPTS, COMPLETIONS)]
    want_ids.append(tok.encode(queries[-1]).ids)
    assert_scores(answer["rewards"], ort_scores(want_ids))
    # Older OpenRLHF sends only the queries.
    answer = post_like_openrlhf(http_server.base_url + "/get_reward", {"query": queries[:1]})
    assert_scores(answer["rewards"], ort_scores([tok.encode(queries[0]).ids]))


def test_openrlhf_long_prompt_is_cut_from_its_start(http_server):
    tok = local_tokenizer()
    prompt = " ".join(f"word{i}" for i in range(400))
    response = " the answer is here."
    answer = post_like_openrlhf(http_server.base_url + "/get_reward",
                                {"query": [prompt + response], "prompts": [prompt], "labels": [None]})
    p_ids = tok.encode(prompt, add_special_tokens=False).ids
    r_ids = tok.encode(response, add_special_tokens=False).ids
    keep = 512 - 3 - len(r_ids)
    assert len(p_ids) > keep
    want = [101] + p_ids[-keep:] + [102] + r_ids + [102]
    assert_scores(answer["rewards"], ort_scores([want]))


def test_openrlhf_errors_use_the_contract_shape(http_server):
    import requests

    url = http_server.base_url + "/get_reward"
    r = requests.post(url, json={"query": ["a", "b"], "prompts": ["a"], "labels": [None, None]}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert "prompts" in r.json()["error"]["message"]
    r = requests.post(url, json={"prompts": ["a"]}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("query")
