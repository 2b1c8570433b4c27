"""Every kind publishes the reward model's chat template in its model info (issue 28, chat templates):
gRPC ModelInfo.chat_template / special_tokens and the HTTP GET /v1/model fields of the same names, read
from the model repository as transformers reads the tokenizer folder: hf/chat_template.jinja first,
else hf/tokenizer_config.json's chat_template (a string, or the "default" of named templates), "" when
there is none; the tokenizer's named special tokens (the variables a template sees), which
tokenizer_json does not carry. A client (the TRL adapter) renders conversations with them, so the
text must be transformers' own on every kind. And every gRPC kind refuses the HTTP-only framework-text
flags in the same words."""

from __future__ import annotations

import pathlib
import subprocess

import grpc
import httpx
import pytest

import servers

KINDS = [k for k in ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime") if k in servers.available_kinds()]
GRPC_KINDS = [k for k in KINDS if servers.launch.transport(k) == "grpc"]
NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
IN_CONFIG = "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ sep_token }}{% endfor %}"
IN_JINJA = "{{ cls_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }} {{ sep_token }}{% endfor %}\n"
NAMED = [{"name": "tool_use", "template": "{{ messages }}"}, {"name": "default", "template": IN_CONFIG}]


def published(server) -> tuple[str, dict]:
    """(chat_template, special_tokens) from the server's model info, on its own transport."""
    if server.transport == "http":
        m = httpx.get(server.base_url + "/v1/model", timeout=30).json()
        return m["chat_template"], m["special_tokens"]
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    with grpc.insecure_channel(server.target) as ch:
        m = reward_pb2_grpc.RewardModelStub(ch).GetModelInfo(reward_pb2.GetModelInfoRequest(), timeout=30)
    return m.chat_template, dict(m.special_tokens)


def transformers_view(repo: pathlib.Path) -> tuple[str, dict]:
    """What transformers 5.24 loads from the same folder: the template and the named special tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(repo / "hf"))
    template = tok.chat_template or ""
    if isinstance(template, dict):
        template = template.get("default", "")
    return template, {k: v for k, v in tok.special_tokens_map.items() if k in NAMES and isinstance(v, str)}


CASES = {
    "jinja_first": dict(config_template=IN_CONFIG, jinja=IN_JINJA),
    "config": dict(config_template=IN_CONFIG),
    "named": dict(config_template=NAMED),
    "none": dict(),
}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    base = tmp_path_factory.mktemp("chat_template_info")
    return {name: servers.model_repo_with_template(base / name, **case) for name, case in CASES.items()}


# The two Python kinds read the repository with one reader (frontends/model_info.py): py-http takes every
# case through it, py-grpc one, for its gRPC wiring (a server start per case; CI has a time budget).
CASES_FOR = {"py-grpc-onnxruntime": ("jinja_first",)}


@pytest.mark.parametrize("kind", KINDS)
def test_model_info_publishes_the_models_chat_template(kind, repos):
    want_text = {"jinja_first": IN_JINJA, "config": IN_CONFIG, "named": IN_CONFIG, "none": ""}
    for name, repo in repos.items():
        if name not in CASES_FOR.get(kind, CASES):
            continue
        s = servers.start(kind, model=repo)
        try:
            text, tokens = published(s)
        finally:
            s.stop(10)
        assert text == want_text[name], (name, text)
        hf_text, hf_tokens = transformers_view(repo)
        assert text == hf_text, name  # the same folder, read as transformers reads it
        assert tokens == hf_tokens and tokens["cls_token"] == "[CLS]" and tokens["sep_token"] == "[SEP]", \
            (name, tokens)


def test_http_publishes_the_template_it_renders_with(tmp_path):
    """py-http started with --chat-template FILE renders conversations with that file: it publishes it."""
    if "py-http-onnxruntime" not in KINDS:
        pytest.skip("py-http-onnxruntime not among the kinds under test")
    f = tmp_path / "mine.jinja"
    f.write_text(IN_JINJA)
    s = servers.start("py-http-onnxruntime", chat_template=str(f))
    try:
        text, tokens = published(s)
    finally:
        s.stop(10)
    assert text == IN_JINJA and tokens["cls_token"] == "[CLS]"


@pytest.mark.parametrize("kind", GRPC_KINDS)
@pytest.mark.parametrize("flag,value,got", [("chat_template", "model", "'model'"),
                                            ("strip_string", "</s>", "('</s>',)")])
def test_grpc_kinds_refuse_http_only_flags_alike(kind, flag, value, got):
    """cpp-grpc said "unknown flag '--chat-template'"; every gRPC kind now says what py-grpc says."""
    p = subprocess.run(servers.command(kind, port=0, **{flag: value}), capture_output=True, text=True,
                       timeout=120, cwd=servers.ROOT)
    out = p.stdout + p.stderr
    name = "--" + flag.replace("_", "-")
    assert p.returncode == 2 and (f"{name}: applies to the HTTP server's framework routes only; "
                                  f"add --transport http, got {got}") in out, out
