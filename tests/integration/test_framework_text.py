"""The framework routes' text handling (frontends/reward_text.py) and its two flags, without a server."""

from __future__ import annotations

import json
import pathlib

import pytest

from rmscore.core.config import ConfigError, ServeConfig
from rmscore.frontends.reward_text import MIN_PROMPT_TAIL, Encoder, chat_template, split_query

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def model(tmp_path) -> pathlib.Path:
    (tmp_path / "manifest.json").write_text("{}")
    return tmp_path


def error_of(model: pathlib.Path, **flags) -> str:
    """The config's error, or the HTTP server's as it compiles --chat-template at start."""
    with pytest.raises(ConfigError) as e:
        chat_template(ServeConfig(model=model, transport="http", **flags))
    return str(e.value)


def test_split_finds_the_prompt_whole_or_cut_from_the_left():
    assert split_query("<pad>Why? Because.</s>", "Why?") == ("Why?", " Because.</s>")
    prompt = "A long prompt whose start the policy's tokenizer cut away. What next?"
    assert split_query(prompt[-30:] + " The answer.", prompt) == (prompt, " The answer.")
    # A tail shorter than MIN_PROMPT_TAIL is a chance match, not the prompt.
    assert split_query(prompt[-(MIN_PROMPT_TAIL - 1):] + " x", prompt) is None
    assert split_query("unrelated text", "another prompt entirely") is None
    assert split_query("anything", None) is None


def test_encoder_strips_and_renders_the_chat_template(tmp_path):
    from rmscore.frontends.reward_text import compile_chat_template

    tok_json = (ROOT / "models" / "default" / "tokenizer.json").read_text()
    tpl = compile_chat_template("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    enc = Encoder(tok_json, 512, ("</s>", "<pad>"), tpl)
    assert enc.strip("<pad>hi</s></s>") == "hi"
    plain = Encoder(tok_json, 512)
    assert enc.encode_one(("q", "a")) == plain.plain.encode("<user>q<assistant>a", add_special_tokens=False).ids
    assert len(Encoder(tok_json, 16).encode_one(("word " * 40, "end"))) == 16


def test_text_flags_are_checked_eagerly(model, tmp_path):
    assert error_of(model, strip_strings=("",)) == "--strip-string: must be a non-empty string, got ''"
    with pytest.raises(ConfigError, match=r"--chat-template: applies to the HTTP server's framework routes only"):
        ServeConfig(model=model, transport="grpc", chat_template="model")
    assert "--chat-template: not a usable chat template (cannot read the file" in \
        error_of(model, chat_template=str(tmp_path / "missing.jinja"))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    assert error_of(model, chat_template=str(bad)).endswith(f"got {str(bad)!r}")
    assert "cannot read" in error_of(model, chat_template="model")
    (model / "hf").mkdir()
    (model / "hf" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    assert "has no chat_template" in error_of(model, chat_template="model")
    (model / "hf" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0].content }}"}))
    cfg = ServeConfig(model=model, transport="http", chat_template="model", strip_strings=("</s>",))
    assert chat_template(cfg).render(messages=[{"content": "x"}]) == "x"
