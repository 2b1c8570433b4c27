"""Conversations rendered with the reward model's own chat template on every route that takes them
(issue 28, defect 5), against real servers:
- vLLM's `messages` (/classify, /pooling, /tokenize) on the FastAPI server, rendered whole (every
  turn, system included) with the model repository's template, as vLLM renders them; refused (400,
  vLLM's words) when the model has none; vLLM's chat options honoured or refused as there;
- the TRL adapter's conversational path, scored as TRL's own reward-model path scores it
  (trl.data_utils.apply_chat_template on prompt + completion, tokenized without added special
  tokens), on every server kind (it sends ids, so the C++ server too), and equal to /classify's
  number for the same conversation.
The reference is transformers' apply_chat_template on the same folder, and ONNX Runtime directly.
"""

from __future__ import annotations

import copy
import math
import pathlib
import threading
import time

import httpx
import pytest

import servers
from rmscore.core.tokenizing import default_max_text_chars
from rmscore_tools.observe import metric
from rmscore_client.adapters.trl import rmscore_async_reward, rmscore_reward
from test_adapters import trl_calculate_rewards
from test_client import GRPC_KINDS, HTTP_KIND, assert_scores, ort_scores, shared_server

# The reward model's own template: every turn, the system prompt included, over BERT's own special
# tokens (what the template writes, so nothing is added when tokenizing), with a caller's variable.
TEMPLATE = ("{{ cls_token }}{% for m in messages %}{% if m.role == 'system' and not brief %}[sys] {{ m.content }} "
            "{% elif m.role != 'system' %}{{ m.role }}: {{ m.content }} {% endif %}{{ sep_token }}{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"},
                {"role": "assistant", "content": "Air scatters blue light."}, {"role": "user", "content": "More?"},
                {"role": "assistant", "content": "Shorter wavelengths scatter more."}]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> pathlib.Path:
    """The default model repository with a chat template in its tokenizer_config.json (the rest linked)."""
    return servers.model_repo_with_template(tmp_path_factory.mktemp("rm") / "rm_with_template", TEMPLATE)


@pytest.fixture(scope="module")
def hf_tok(repo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(repo / "hf"))


@pytest.fixture(scope="module")
def templated(repo):
    s = servers.start(HTTP_KIND, model=repo)
    try:
        with httpx.Client(base_url=s.base_url, timeout=60) as c:
            yield c
    finally:
        s.stop(10)


def reference(hf_tok, messages, **options) -> float:
    """The raw reward of the conversation as transformers renders and tokenizes it (vLLM's and TRL's way)."""
    text = hf_tok.apply_chat_template(messages, tokenize=False, **options)
    return ort_scores([hf_tok(text, add_special_tokens=False)["input_ids"]])[0]


def test_vllm_messages_are_rendered_whole_with_the_models_template(templated, hf_tok):
    # Before: the conversation was cut into (every earlier turn joined, the last turn) and scored as
    # encode(prompt, response), the system prompt a line of the "prompt": another number than vLLM's.
    want = reference(hf_tok, CONVERSATION)
    r = templated.post("/classify", json={"messages": CONVERSATION, "use_activation": False})
    assert r.status_code == 200, r.text
    assert_scores(r.json()["data"][0]["probs"], [want])
    r = templated.post("/pooling", json={"messages": CONVERSATION})
    assert r.status_code == 200, r.text
    assert_scores(r.json()["data"][0]["data"], [1 / (1 + math.exp(-want))])
    # vLLM's chat options reach the template: add_generation_prompt and chat_template_kwargs.
    r = templated.post("/classify", json={"messages": CONVERSATION[:2], "add_generation_prompt": True,
                                          "chat_template_kwargs": {"brief": True}, "use_activation": False})
    assert r.status_code == 200, r.text
    assert_scores(r.json()["data"][0]["probs"],
                  [reference(hf_tok, CONVERSATION[:2], add_generation_prompt=True, brief=True)])
    # Content parts: the text parts joined by newlines (vLLM's "string" content format).
    parts = [{"role": "user", "content": [{"type": "text", "text": "Why is"}, {"type": "text", "text": "the sky blue?"}]},
             CONVERSATION[2]]
    r = templated.post("/classify", json={"messages": parts, "use_activation": False})
    assert r.status_code == 200, r.text
    assert_scores(r.json()["data"][0]["probs"],
                  [reference(hf_tok, [{"role": "user", "content": "Why is\nthe sky blue?"}, CONVERSATION[2]])])
    # A request's add_special_tokens adds the tokenizer's on top of the template's, as vLLM's does.
    r = templated.post("/classify", json={"messages": CONVERSATION, "add_special_tokens": True, "use_activation": False})
    text = hf_tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert_scores(r.json()["data"][0]["probs"], ort_scores([hf_tok(text)["input_ids"]]))


def test_vllm_tokenize_renders_as_vllm(templated, hf_tok):
    # vLLM's TokenizeChatRequest adds the generation prompt unless told not to.
    r = templated.post("/tokenize", json={"messages": CONVERSATION[:2]})
    assert r.status_code == 200, r.text
    want = hf_tok(hf_tok.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
    assert r.json()["tokens"] == want and r.json()["count"] == len(want)
    r = templated.post("/tokenize", json={"messages": CONVERSATION, "add_generation_prompt": False})
    assert r.json()["tokens"] == hf_tok(hf_tok.apply_chat_template(CONVERSATION, tokenize=False),
                                        add_special_tokens=False)["input_ids"]


def test_vllm_chat_options_refused_as_vllm_refuses_them(templated):
    for body, words in [
        ({"add_generation_prompt": True, "continue_final_message": True},
         "Cannot set both `continue_final_message` and `add_generation_prompt` to True."),
        ({"chat_template": "{{ messages }}"}, "--trust-request-chat-template is not set"),
        ({"chat_template_kwargs": {"chat_template": "{{ messages }}"}}, "--trust-request-chat-template is not set"),
    ]:
        r = templated.post("/classify", json={"messages": CONVERSATION, **body})
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_a_conversation_over_the_text_cap_is_refused_on_every_route_that_renders_it(templated):
    # --max-text-chars bounds the text tokenized: a conversation is one text once rendered. Before,
    # /classify and /pooling checked each message alone and scored three of 60,000 characters (one
    # 180,021-character text for the tokenizer) that /tokenize refused.
    cap = default_max_text_chars(512)  # the default model's window; the server sets no --max-text-chars
    messages = [{"role": "user", "content": "a " * 30000}] * 3
    total = sum(len(m["content"]) for m in messages)
    for route in ("/classify", "/pooling"):
        r = templated.post(route, json={"messages": messages})
        assert r.status_code == 400, (route, r.text[:300])
        assert r.json()["error"]["message"] == (f"messages: {total} characters exceed max_text_chars {cap}; cut "
                                                "the text before sending (or send token ids)"), route
    r = templated.post("/tokenize", json={"messages": messages})
    assert r.status_code == 400 and "characters exceed max_text_chars" in r.json()["error"]["message"]
    # Within the cap by the messages, over it once the template's own text is added: the rendered
    # text is checked too, before it is tokenized.
    near = [{"role": "user", "content": "a" * (cap // 2)}, {"role": "assistant", "content": "a" * (cap - cap // 2)}]
    r = templated.post("/classify", json={"messages": near})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages: "), r.text[:300]
    assert "characters exceed max_text_chars" in r.json()["error"]["message"]


def test_messages_without_a_template_are_refused_as_vllm_refuses_them():
    # The default model has no chat template: vLLM answers 400 (transformers >= 4.44 has no default
    # template); rmscore used to split the conversation and score a pair vLLM never would.
    s = shared_server(HTTP_KIND)
    with httpx.Client(base_url=s.base_url, timeout=60) as c:
        for path in ("/classify", "/pooling", "/tokenize"):
            r = c.post(path, json={"messages": CONVERSATION})
            assert r.status_code == 400, r.text
            msg = r.json()["error"]["message"]
            assert "default chat template is no longer allowed" in msg and "has no chat_template" in msg, msg


def trl_own_reference(hf_tok, prompts, completions) -> list[float]:
    """TRL 1.16's GRPOTrainer._calculate_rewards for an nn.Module reward model, up to the logits:
    apply_chat_template({"messages": p + c}) per example, then the reward tokenizer without special tokens."""
    from trl.data_utils import apply_chat_template

    texts = [apply_chat_template({"messages": p + c}, hf_tok)["text"] for p, c in zip(prompts, completions)]
    return ort_scores([hf_tok(t, add_special_tokens=False)["input_ids"] for t in texts])


@pytest.mark.parametrize("kind", GRPC_KINDS + [HTTP_KIND])
def test_trl_conversational_path_scores_as_trls_own(kind, repo, hf_tok):
    prompts = [CONVERSATION[:2], [{"role": "user", "content": "Name a prime number."}]]
    completions = [[{"role": "assistant", "content": "Air scatters blue light."}],
                   [{"role": "assistant", "content": "Seven."}]]
    s = shared_server(kind)  # the template is the client's: any server, any kind, scores the same ids
    target = s.base_url if kind == HTTP_KIND else s.target
    http = kind == HTTP_KIND
    sync_f = rmscore_reward(target, http=http, chat_template=repo)
    async_f = rmscore_async_reward(target, http=http, chat_template=hf_tok, name="rm_async")
    try:
        _, (r_sync, r_async) = trl_calculate_rewards([sync_f, async_f], [{"prompt": p} for p in prompts],
                                                     prompts, completions, [[1]] * 2)
    finally:
        sync_f.close()
    want = trl_own_reference(hf_tok, prompts, completions)
    assert_scores(r_sync, want)
    assert_scores(r_async, want)


def test_one_rendering_for_trl_and_vllm_routes(repo, templated):
    """The same conversation through the TRL adapter and through /classify: one number."""
    f = rmscore_reward(shared_server(HTTP_KIND).base_url, http=True, chat_template=repo)
    try:
        via_trl = f(prompts=[CONVERSATION[:-1]], completions=[CONVERSATION[-1:]])
    finally:
        f.close()
    r = templated.post("/classify", json={"messages": CONVERSATION, "use_activation": False})
    assert_scores(via_trl, r.json()["data"][0]["probs"])


@pytest.mark.parametrize("kind", GRPC_KINDS + [HTTP_KIND])
def test_trl_adapter_defaults_to_the_template_the_server_publishes(kind, repo, hf_tok, caplog):
    """No chat_template=: the adapter asks the server's model info (ModelInfo.chat_template and
    special_tokens) once and renders with it, as TRL's own path renders with the reward model's
    template. Before, it joined the contents (another number) and warned."""
    prompts = [CONVERSATION[:2], [{"role": "user", "content": "Name a prime number."}]]
    completions = [[{"role": "assistant", "content": "Air scatters blue light."}],
                   [{"role": "assistant", "content": "Seven."}]]
    s = servers.start(kind, model=repo)
    target = s.base_url if kind == HTTP_KIND else s.target
    http = kind == HTTP_KIND
    sync_f = rmscore_reward(target, http=http)
    async_f = rmscore_async_reward(target, http=http, name="rm_async")
    # chat_template= still wins over the server's: the brief variable changes the rendering.
    mine = copy.deepcopy(hf_tok)
    mine.chat_template = TEMPLATE.replace("{{ m.role }}: ", "<{{ m.role }}> ")
    own = rmscore_reward(target, http=http, chat_template=mine, name="own")
    try:
        with caplog.at_level("WARNING", logger="rmscore_client.adapters.trl"):
            _, (r_sync, r_async, r_own) = trl_calculate_rewards(
                [sync_f, async_f, own], [{"prompt": p} for p in prompts], prompts, completions, [[1]] * 2)
    finally:
        sync_f.close()
        own.close()
        s.stop(10)
    want = trl_own_reference(hf_tok, prompts, completions)
    assert_scores(r_sync, want)
    assert_scores(r_async, want)
    assert not [r for r in caplog.records if "joined by blank lines" in r.getMessage()]
    assert_scores(r_own, trl_own_reference(mine, prompts, completions))
    assert r_own != r_sync


def test_trl_adapter_without_any_template_keeps_joined_text(caplog):
    """The default model has no template and none is passed: today's joined text, warned once."""
    f = rmscore_reward(shared_server(HTTP_KIND).base_url, http=True)
    try:
        with caplog.at_level("WARNING", logger="rmscore_client.adapters.trl"):
            got = f(prompts=[CONVERSATION[:2]], completions=[CONVERSATION[2:3]])
            f(prompts=[CONVERSATION[:2]], completions=[CONVERSATION[2:3]])
        want = f.client.score_texts(["Be brief.\n\nWhy is the sky blue?"], ["Air scatters blue light."]).scores
    finally:
        f.close()
    assert_scores(got, want)
    warned = [r for r in caplog.records if "joined by blank lines" in r.getMessage()]
    assert len(warned) == 1 and "publishes no chat template" in warned[0].getMessage()


def vllm_score_pair_reference(hf_tok, query: str, document: str) -> float:
    """vLLM's cross-encoder score prompt with a chat template (scoring/io_processor.py
    CrossEncoderIOProcessor.get_score_prompt at c2dbc3c5): query and document messages rendered by
    apply_chat_template(tokenize=False), then tokenized with the tokenizer's special tokens added."""
    text = hf_tok.apply_chat_template([{"role": "query", "content": query}, {"role": "document", "content": document}],
                                      tokenize=False)
    return ort_scores([hf_tok(text)["input_ids"]])[0]


def test_vllm_score_and_rerank_pairs_render_as_vllm_with_a_chat_template(repo, hf_tok):
    """With --chat-template, vLLM renders a /score or /rerank pair as a "query" and a "document"
    message and tokenizes the text with special tokens; rmscore rendered a user and an assistant
    message without them (/get_reward's rendering), another number."""
    s = servers.start(HTTP_KIND, model=repo, chat_template="model")
    query, docs = "Why is the sky blue?", ["Air scatters blue light.", "Seven."]
    try:
        with httpx.Client(base_url=s.base_url, timeout=60) as c:
            score = c.post("/score", json={"text_1": query, "text_2": docs, "use_activation": False})
            rerank = c.post("/rerank", json={"query": query, "documents": docs, "use_activation": False})
        seen = _tokenize_queue_while(s, "/rerank", {"query": "why is the sky blue " * 5000,
                                                    "documents": [f"document {k}" for k in range(16)]})
    finally:
        s.stop(10)
    # Rendered whole, each pair tokenizes the query again: admission counts every pair's characters
    # (before: the distinct texts', 100,000 for 16 x 100,000 tokenized).
    assert seen >= 16 * 100_000, seen
    want = [vllm_score_pair_reference(hf_tok, query, d) for d in docs]
    assert score.status_code == 200, score.text
    assert_scores([d["score"] for d in score.json()["data"]], want)
    assert rerank.status_code == 200, rerank.text
    assert_scores([r["relevance_score"] for r in sorted(rerank.json()["results"], key=lambda r: r["index"])], want)


def _tokenize_queue_while(server, route: str, body: dict) -> float:
    """The most rmscore_tokenize_queue_characters read while `route` answers `body` (polled every 20 ms)."""
    done = threading.Event()

    def send():
        try:
            assert httpx.post(server.base_url + route, json=body, timeout=120).status_code == 200
        finally:
            done.set()
    t = threading.Thread(target=send)
    t.start()
    most = 0.0
    while not done.is_set():
        most = max(most, metric(server, "rmscore_tokenize_queue_characters"))
        time.sleep(0.02)
    t.join()
    return most
