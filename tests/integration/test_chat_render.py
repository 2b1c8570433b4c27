"""The one chat-template renderer (rmscore_client.chat.ChatTemplate) against transformers' own
`apply_chat_template`, which TRL's reward-model path and vLLM's chat requests call: the same text for
the same template, messages and options, and the server's pair path (--chat-template) the same ids.
No server: the tokenizer is the default model's, given a template in a copy of its hf/ folder."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from rmscore_client.chat import ChatTemplate, ChatTemplateError

ROOT = pathlib.Path(__file__).resolve().parents[2]
HF = ROOT / "models" / "default" / "hf"

# The special tokens a BERT tokenizer has (cls, sep, ...) plus bos/eos, as a decoder's would have (tokens
# its tokenizer.json already holds as special, as a decoder's holds its own bos and eos).
BOS, EOS = "[MASK]", "[SEP]"
TEMPLATES = {
    # Llama-3-like: bos_token first, a header per turn, the generation prompt.
    "llama": ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>\n\n{{ m['content'] | trim }}{{ eos_token }}"
              "{% endfor %}{% if add_generation_prompt %}<assistant>\n\n{% endif %}"),
    # ChatML-like, with what transformers' environment adds to Jinja: tojson (no HTML escaping, non-ASCII
    # kept), loop controls, {% generation %}, raise_exception, and a missing key where a value was None.
    "chatml": ("{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
               "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
               "{% if m.role == 'stop' %}{% break %}{% endif %}<|im_start|>{{ m.role }}\n"
               "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
               "{% else %}{{ m.content }}{% endif %}{% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}"
               "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # A cross-encoder style one over BERT's own tokens, with a template variable of the caller's.
    "bert": ("{{ cls_token }}{% for m in messages %}{% if m.role == 'system' and not brief %}[sys] {{ m.content }} "
             "{% elif m.role != 'system' %}{{ m.role }}: {{ m.content }} {% endif %}{{ sep_token }}{% endfor %}"),
}
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky <blue>?"},
     {"role": "assistant", "content": "Rayleigh scattering."}],
    [{"role": "user", "content": "Café naïve 🙂 \"quoted\""}, {"role": "assistant", "content": None,
                                                              "tool_calls": [{"name": "f", "arguments": {"x": "é"}}]},
     {"role": "user", "content": "and?"}, {"role": "assistant", "content": "Done."}],
]


def repo_with(tmp_path: pathlib.Path, template: str) -> pathlib.Path:
    """A copy of the default model's hf/ folder whose tokenizer has `template` and bos/eos tokens."""
    hf = tmp_path / "hf"
    shutil.copytree(HF, hf, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((hf / "tokenizer_config.json").read_text())
    cfg.update(chat_template=template, bos_token=BOS, eos_token=EOS)
    (hf / "tokenizer_config.json").write_text(json.dumps(cfg))
    return hf


def hf_tokenizer(hf: pathlib.Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf))


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_renders_what_transformers_renders(tmp_path, name):
    hf = repo_with(tmp_path, TEMPLATES[name])
    tok, ours = hf_tokenizer(hf), ChatTemplate.from_pretrained(hf)
    assert ours.special_tokens["bos_token"] == BOS and ours.special_tokens["cls_token"] == "[CLS]"
    tools = [{"type": "function", "function": {"name": "f", "description": "<b>é</b>"}}]
    for messages in CONVERSATIONS:
        for options in ({}, {"add_generation_prompt": True}, {"continue_final_message": True}, {"brief": True},
                        {"tools": tools}):
            want = tok.apply_chat_template(messages, tokenize=False, **options)
            assert ours.render(messages, **options) == want, (name, options)
    # Both loaders of the same folder agree: transformers' tokenizer object, and the folder.
    assert ChatTemplate.from_tokenizer(tok).render(CONVERSATIONS[0]) == ours.render(CONVERSATIONS[0])


def test_template_errors_are_said():
    t = ChatTemplate(TEMPLATES["chatml"])
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        t.render([{"role": "bad", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        t.render([])
    with pytest.raises(ChatTemplateError, match="cannot both be true"):
        t.render(CONVERSATIONS[0], add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="not a Jinja template"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="not a file, a directory or a template, got 'nowhere/x'"):
        ChatTemplate.load("nowhere/x")


def test_pickles_and_loads_from_what_a_user_has(tmp_path):
    import pickle

    hf = repo_with(tmp_path, TEMPLATES["llama"])
    t = ChatTemplate.load(hf.parent)  # an rmscore model repository: its hf/ folder
    assert pickle.loads(pickle.dumps(t)).render(CONVERSATIONS[0]) == t.render(CONVERSATIONS[0])
    assert ChatTemplate.load(hf / "tokenizer_config.json").special_tokens == t.special_tokens
    assert ChatTemplate.load(TEMPLATES["llama"]).render(CONVERSATIONS[0]).startswith("<system>")  # no bos: text only


def test_the_servers_pair_path_tokenizes_as_transformers(tmp_path):
    """--chat-template on /get_reward's pairs: the pair as a user and an assistant
    message, with the tokenizer's special tokens in the template (before: bos_token and eos_token
    rendered as "", and cls_token/sep_token undefined), tokenized without added special tokens."""
    from rmscore.frontends.reward_text import Encoder, load_chat_template

    hf = repo_with(tmp_path, TEMPLATES["llama"])
    repo = hf.parent
    tok = hf_tokenizer(hf)
    enc = Encoder((ROOT / "models" / "default" / "tokenizer.json").read_text(), 512,
                  chat_template=load_chat_template("model", repo))
    pair = ("Why is the sky blue?", "Because air scatters blue light more.")
    text = tok.apply_chat_template([{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}],
                                   tokenize=False)
    assert enc.encode_one(pair) == tok(text, add_special_tokens=False)["input_ids"]
    # A template file (--chat-template FILE) renders with the model tokenizer's special tokens too.
    f = tmp_path / "rm.jinja"
    f.write_text(TEMPLATES["bert"])
    assert load_chat_template(str(f), repo).render([{"role": "user", "content": "q"}], brief=True) == \
        "[CLS]user: q [SEP]"
    # `--chat-template model` takes hf/chat_template.jinja over tokenizer_config.json's, as
    # transformers does (docs/frameworks/openrlhf.md), special tokens and all.
    (hf / "chat_template.jinja").write_text(TEMPLATES["bert"])
    jinja = load_chat_template("model", repo)
    assert jinja.text == TEMPLATES["bert"] == hf_tokenizer(hf).chat_template
    assert jinja.render([{"role": "user", "content": "q"}], brief=True) == "[CLS]user: q [SEP]"
