"""Conversations rendered with the reward model's own chat template: the one renderer of rmscore.

The FastAPI server's framework routes (vLLM's `messages`, /get_reward and vLLM text pairs with
--chat-template) and the TRL adapter's conversational path all render through `ChatTemplate`, so a
conversation becomes the same text, and the same token ids, on every route and every server kind
(the adapter sends ids, which the C++ server takes too).

It renders as transformers' `apply_chat_template(..., tokenize=False)` does (checked against
transformers 5.24, utils/chat_template_utils.py `_compile_jinja_template` and
`render_jinja_template`, tokenization_utils_base.py `apply_chat_template`; held equal by
tests/integration/test_chat_render.py): a sandboxed Jinja environment with `trim_blocks` and
`lstrip_blocks`, the loop controls and `{% generation %}` extensions, its `tojson` (no HTML
escaping, non-ASCII kept), `raise_exception` and `strftime_now`; message keys whose value is None
dropped; the tokenizer's named special tokens (`bos_token`, `eos_token`, ...) as template variables,
which keyword arguments override; `continue_final_message` cut after the final message's text. The
rendered text already holds the template's special tokens: tokenize it without adding any (TRL's
reward-model path and vLLM's chat requests both do).

jinja2 (>= 3.1.6, as transformers requires: older ones have sandbox escapes) is imported on first use:
`pip install 'rmscore-client[tokenize]'`.
"""

from __future__ import annotations

import json
import os
import pathlib
from datetime import datetime
from typing import Any

#: transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens a template sees as variables.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: What transformers appends to the final message to find where it ends in the rendered text.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """The template cannot be loaded, compiled or rendered for these messages; the message says why."""


def _environment():
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("rendering a chat template needs jinja2>=3.1.6: pip install 'rmscore-client[tokenize]'") \
            from None
    if tuple(int(x) for x in jinja2.__version__.split(".")[:3] if x.isdigit()) < (3, 1, 6):
        raise ImportError(f"rendering a chat template needs jinja2>=3.1.6 (older versions have sandbox escapes), "
                          f"got {jinja2.__version__}")

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (transformers uses it to mark the
        assistant's tokens; the text is the same)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; transformers' (and so the model's training text) does not.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def compile_template(text: str):
    """The Jinja template of `text` in Hugging Face's chat-template dialect; ChatTemplateError if it is not one."""
    env = _environment()
    try:
        return env.from_string(text)
    except Exception as e:  # noqa: BLE001 - a syntax error, said with its line
        raise ChatTemplateError(f"not a Jinja template: {e}") from None


def special_token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def special_tokens(folder: pathlib.Path, config: dict | None = None) -> dict[str, str]:
    """The named special tokens of the Hugging Face tokenizer in `folder`: tokenizer_config.json's,
    then special_tokens_map.json's for those it lacks; none from a file that cannot be read."""
    out: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        data = config if name == "tokenizer_config.json" and config is not None else None
        if data is None:
            try:
                data = json.loads((folder / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
        for k in SPECIAL_TOKEN_NAMES:
            if k not in out and (v := special_token_text(data.get(k))) is not None:
                out[k] = v
    return out


def _pick(template: Any, source: str) -> str:
    """tokenizer_config.json's chat_template: a string, or named templates (then "default")."""
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...], as transformers saves several
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise ChatTemplateError(f"{source} has no chat_template")
    return template


def read_pretrained(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """The chat template text and named special tokens of a Hugging Face tokenizer directory (an
    rmscore model repository's `hf/`, or its root) or its tokenizer_config.json, read, not compiled:
    `chat_template.jinja` when there (transformers >= 4.50 saves the template there), else
    tokenizer_config.json's `chat_template`; special tokens from tokenizer_config.json, then
    special_tokens_map.json. ChatTemplateError when there is no template. What servers publish
    (ModelInfo.chat_template) and what `ChatTemplate.from_pretrained` compiles."""
    p = pathlib.Path(path)
    if p.is_dir() and not (p / "tokenizer_config.json").is_file() and (p / "hf" / "tokenizer_config.json").is_file():
        p = p / "hf"
    config_path = p if p.is_file() else p / "tokenizer_config.json"
    folder = config_path.parent
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChatTemplateError(f"cannot read {config_path}: {e}") from None
    jinja = folder / "chat_template.jinja"
    text = jinja.read_text(encoding="utf-8") if jinja.is_file() else _pick(config.get("chat_template"), str(config_path))
    return text, special_tokens(folder, config)


class ChatTemplate:
    """A reward model's chat template and the special tokens its tokenizer hands the template."""

    def __init__(self, text: str, special_tokens: dict[str, str] | None = None):
        self.text = text
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)}
        self.compiled = compile_template(text)

    def __reduce__(self):
        # The compiled template does not pickle; the text and tokens rebuild it (TRL's AsyncGRPOTrainer
        # sends reward functions, and so their template, to a worker process).
        return type(self), (self.text, self.special_tokens)

    @classmethod
    def load(cls, source: Any) -> ChatTemplate:
        """A ChatTemplate from what a user has at hand: a ChatTemplate; a Hugging Face tokenizer
        directory, an rmscore model repository or a tokenizer_config.json (`from_pretrained`); a
        `.jinja` file or template text (no special tokens then); or a transformers tokenizer."""
        if isinstance(source, ChatTemplate):
            return source
        if isinstance(source, (str, os.PathLike)):
            p = pathlib.Path(source)
            if isinstance(source, str) and ("{{" in source or "{%" in source):
                return cls(source)
            if p.is_file() and p.suffix == ".jinja":
                return cls(p.read_text(encoding="utf-8"))
            if p.exists():
                return cls.from_pretrained(p)
            raise ChatTemplateError(f"chat_template: not a file, a directory or a template, got {source!r}")
        if hasattr(source, "chat_template") and hasattr(source, "special_tokens_map"):
            return cls.from_tokenizer(source)
        raise TypeError(f"chat_template: expected a path, template text, a ChatTemplate or a transformers "
                        f"tokenizer, got {type(source).__name__}")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> ChatTemplate:
        """From a Hugging Face tokenizer directory (an rmscore model repository's `hf/`, or its root),
        or its tokenizer_config.json (`read_pretrained`)."""
        text, tokens = read_pretrained(path)
        return cls(text, tokens)

    @classmethod
    def from_model_info(cls, info) -> ChatTemplate | None:
        """The template a server publishes in its model info (gRPC ModelInfo / GET /v1/model:
        `chat_template`, `special_tokens`), or None when it publishes none (the model has none, or
        the server predates the field)."""
        text = getattr(info, "chat_template", None) or None
        return None if text is None else cls(text, dict(getattr(info, "special_tokens", None) or {}))

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatTemplate:
        """From a transformers tokenizer (`AutoTokenizer.from_pretrained(reward_model)`, what TRL
        uses as the reward model's processing class): its chat_template and special_tokens_map."""
        template = tokenizer.chat_template
        if isinstance(template, dict):
            template = template.get("default")
        return cls(_pick(template, f"{type(tokenizer).__name__}"), dict(tokenizer.special_tokens_map))

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
               continue_final_message: bool = False, **kwargs) -> str:
        """The conversation as text, with the template's own special tokens (tokenize it without adding any)."""
        if not messages:
            raise ChatTemplateError("cannot render an empty conversation; send at least one message")
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be true")
        chat = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise ChatTemplateError(f"messages[{i}]: expected a message dict, got {type(m).__name__}")
            # Templates fail on, or print, a None value (an API's content=None beside tool_calls) but
            # handle a missing key: transformers drops such keys.
            chat.append({k: v for k, v in m.items() if v is not None})
        final = None
        if continue_final_message:
            final = chat[-1].get("content")
            if not isinstance(final, str):
                raise ChatTemplateError("continue_final_message: the final message has no text content to continue")
            chat[-1] = {**chat[-1], "content": final + _CONTINUE_TAG}
        variables = {**self.special_tokens, **kwargs}
        try:
            text = self.compiled.render(messages=chat, tools=variables.pop("tools", None),
                                        documents=variables.pop("documents", None),
                                        add_generation_prompt=add_generation_prompt, **variables)
        except Exception as e:  # noqa: BLE001 - raise_exception in the template, or an error in it
            raise ChatTemplateError(f"the chat template failed: {e}") from None
        if final is not None:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise ChatTemplateError("continue_final_message: the template drops part of the final message")
            at = text.rindex(tag)
            text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
        return text

    def render_pair(self, prompt: str, response: str) -> str:
        """A (prompt, response) pair as one user and one assistant message."""
        return self.render([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}])


__all__ = ["ChatTemplate", "ChatTemplateError", "compile_template", "read_pretrained", "special_tokens",
           "SPECIAL_TOKEN_NAMES"]
