"""How the FastAPI server's framework routes (OpenRLHF's /get_reward, the vLLM pooling routes) turn
a trainer's text into this reward model's token ids.

Trainers send text in the *policy's* format: OpenRLHF decodes prompt + response with
`skip_special_tokens=False`, so the policy's chat template, EOS and pad strings are in it. Two
per-server options (core/config.py, "framework text") bring it to the reward model's format:
- `--strip-string S` (repeatable): every occurrence of S is removed from queries and prompts
  before anything else (EOS, pad, template markers of the policy).
- `--chat-template FILE|model`: a (prompt, response) pair of /get_reward is rendered with the reward
  model's own chat template as a user and an assistant message, then tokenized as one text without
  added special tokens (the template writes its own); a vLLM /score or /rerank pair as vLLM renders
  it (a "query" and a "document" message, tokenized with special tokens added: vllm_pairs.py); `model` takes the model repository's own template
  (hf/chat_template.jinja, else hf/tokenizer_config.json `chat_template`). The HTTP server loads and
  compiles it as it starts (`chat_template`), before the model loads: the config holds the flag,
  not the template.

A pair without a template is `encode(prompt, response)`, the same as the /rmscore/v1/score text path.

Conversations (vLLM's `messages`) are rendered whole, every turn, as vLLM renders them: with
--chat-template when set, else with the model repository's own template (`conversation_template`),
and refused when there is neither, as vLLM refuses. Every template renders through
rmscore_client.chat.ChatTemplate, the one renderer the TRL adapter uses too (transformers'
sandboxed Jinja, the tokenizer's special tokens as variables).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from rmscore_client.chat import ChatTemplate, ChatTemplateError, special_tokens

from rmscore.core.config import ConfigError, ServeConfig
from rmscore.core.errors import invalid
from rmscore.core.tokenizing import check_char_count, check_chars, encode_ids

#: The shortest tail of a prompt that counts as "the prompt, cut from the left" in a query: shorter
#: tails (a word, a space) would match by chance anywhere.
MIN_PROMPT_TAIL = 16


def _model_hf(model: pathlib.Path) -> pathlib.Path:
    return model / "hf"


def load_chat_template(spec: str, model: pathlib.Path) -> ChatTemplate:
    """The template of `--chat-template` (a file, or `model`) with the model's special tokens (as
    vLLM's --chat-template FILE renders with the model tokenizer's); ValueError says why not."""
    if spec == "model":
        return ChatTemplate.from_pretrained(_model_hf(model))
    try:
        text = pathlib.Path(spec).read_text()
    except OSError as e:
        raise ValueError(f"cannot read the file: {e.strerror}") from None
    return ChatTemplate(text, special_tokens(_model_hf(model)))


def model_chat_template(model: pathlib.Path) -> tuple[ChatTemplate | None, str]:
    """The model repository's own template, or None and why not (the reason vLLM's refusal carries)."""
    try:
        return ChatTemplate.from_pretrained(_model_hf(model)), ""
    except (ChatTemplateError, OSError) as e:
        return None, str(e)


def compile_chat_template(text: str) -> ChatTemplate:
    """A template in Hugging Face's chat-template dialect (sandboxed, as transformers renders it),
    without special tokens."""
    return ChatTemplate(text)


def chat_template(cfg: ServeConfig) -> ChatTemplate | None:
    """The template of `--chat-template`, or None without one; ConfigError, worded as the config's
    own flag errors, when it cannot be read or is not a template."""
    if cfg.chat_template is None:
        return None
    try:
        return load_chat_template(cfg.chat_template, cfg.model)
    except Exception as e:  # noqa: BLE001 - unreadable or not a template: said with the value
        raise ConfigError(f"--chat-template: not a usable chat template ({e}), got {cfg.chat_template!r}") from None


@dataclass(frozen=True)
class Conversation:
    """A conversation to render whole with the conversation template, then tokenize: vLLM's
    `messages` with its chat options (add_generation_prompt, continue_final_message, kwargs)."""

    messages: tuple
    options: tuple = ()  # (name, value) pairs handed to ChatTemplate.render

    def texts(self) -> list[str]:
        return [m["content"] for m in self.messages if isinstance(m.get("content"), str)]


def split_query(query: str, prompt: str | None) -> tuple[str, str] | None:
    """(prompt, response) when the query holds the prompt, else None (score the query as one segment).

    The response is the text after the prompt's first occurrence (what comes before it, e.g. left
    padding, is dropped). A prompt cut from the left (OpenRLHF keeps the last prompt_max_len tokens
    of a long prompt) is found by its longest tail that occurs in the query, at least
    MIN_PROMPT_TAIL characters; the pair keeps the whole prompt."""
    if not prompt:
        return None
    k = query.find(prompt)
    if k >= 0:
        return prompt, query[k + len(prompt):]
    # A tail that occurs implies every shorter tail occurs: binary search for the longest one.
    lo, hi = 0, len(prompt) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prompt[-mid:] in query:
            lo = mid
        else:
            hi = mid - 1
    if lo < min(MIN_PROMPT_TAIL, len(prompt)):
        return None
    tail = prompt[-lo:]
    return prompt, query[query.find(tail) + lo:]


class _Capped:
    """A Tokenizer whose `encode` refuses a text over the cap before reading it and runs through
    encode_batch, which releases the GIL (core/tokenizing.py): the routes that call the tokenizer
    directly (vLLM's /tokenize) get both without knowing of them."""

    def __init__(self, tokenizer, max_chars: int):
        self.tokenizer, self.max_chars = tokenizer, max_chars

    def encode(self, first: str, second: str | None = None, add_special_tokens: bool = True):
        for text in (first, second):
            if text is not None:
                check_chars(text, self.max_chars, "input")
        item = first if second is None else (first, second)
        return self.tokenizer.encode_batch([item], add_special_tokens=add_special_tokens)[0]

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


class Encoder:
    """The model's tokenizer as the framework routes use it: strings stripped, the optional chat
    template, and cuts to max_sequence_length that never stop training: a pair loses the start of
    its prompt first; a text that alone is too long keeps its last max_len tokens. A text over
    `max_chars` (--max-text-chars) is refused INVALID_ARGUMENT before it is tokenized."""

    def __init__(self, tokenizer_json: str, max_len: int, strip: tuple[str, ...] = (),
                 chat_template: ChatTemplate | None = None, max_chars: int = 1 << 62,
                 conversation_template: ChatTemplate | None = None, no_template_reason: str = ""):
        from tokenizers import Tokenizer

        self.max_len = max_len
        self.max_chars = max_chars
        self.strip_strings = tuple(s for s in strip if s)
        self.template = chat_template  # --chat-template, for pairs; None: encode(prompt, response)
        # Conversations: --chat-template, else the model's own (vLLM's order); None: refused.
        self.conversation_template = chat_template or conversation_template
        self.no_template_reason = no_template_reason
        plain = Tokenizer.from_str(tokenizer_json)
        plain.no_padding()
        plain.no_truncation()
        self.plain = _Capped(plain, max_chars)
        self.cut_prompt = Tokenizer.from_str(tokenizer_json)
        self.cut_prompt.no_padding()
        self.cut_prompt.enable_truncation(max_len, strategy="only_first", direction="left")

    def strip(self, text: str) -> str:
        for s in self.strip_strings:
            text = text.replace(s, "")
        return text

    def strip_pair(self, pair: tuple[str, str]) -> tuple[str, str]:
        return self.strip(pair[0]), self.strip(pair[1])

    def render(self, prompt: str, response: str) -> str:
        try:
            return self.template.render_pair(prompt, response)
        except ChatTemplateError as e:
            raise invalid(f"--chat-template: {e}") from None

    def render_score_pair(self, first: str, second: str) -> str:
        """A vLLM /score or /rerank pair as vLLM renders it with a chat template (its
        CrossEncoderIOProcessor.get_score_prompt): a "query" and a "document" message, no generation
        prompt; the caller tokenizes the text with the tokenizer's special tokens added, as vLLM does."""
        try:
            return self.template.render([{"role": "query", "content": first}, {"role": "document", "content": second}])
        except ChatTemplateError as e:
            raise invalid(f"--chat-template: {e}") from None

    def render_conversation(self, conv: Conversation) -> str:
        """The whole conversation (strings stripped from its texts) as the template renders it;
        INVALID_ARGUMENT, worded as vLLM's, when there is no template or it refuses the messages."""
        if self.conversation_template is None:
            # vLLM's refusal (its ChatTemplateResolutionError), then why this model has none.
            raise invalid("messages: As of transformers v4.44, default chat template is no longer allowed, so you "
                          "must provide a chat template if the tokenizer does not define one. (rmscore: "
                          f"{self.no_template_reason or 'the model has no chat template'}; start the server "
                          "with --chat-template FILE)")
        messages = [{**m, "content": self.strip(m["content"])} if isinstance(m.get("content"), str) else m
                    for m in conv.messages]
        try:
            return self.conversation_template.render(messages, **dict(conv.options))
        except ChatTemplateError as e:
            raise invalid(f"messages: {e}") from None

    def check(self, item, where: str = "input") -> None:
        """INVALID_ARGUMENT when a text of `item` is over max_chars: lengths only, nothing read. A
        conversation is one text once rendered, so its messages count together ("messages", as
        /tokenize says of the rendered text): three messages of 60,000 characters each were scored
        on /classify while /tokenize refused them."""
        if isinstance(item, Conversation):
            check_char_count(sum(map(len, item.texts())), self.max_chars, "messages")
            return
        for text in item if isinstance(item, tuple) else (item,):
            check_chars(text, self.max_chars, where)

    def encode_one(self, item: tuple[str, str] | str, add_special_tokens: bool = True) -> list[int]:
        return self.encode([item], add_special_tokens)[0]

    def encode(self, items: list[tuple[str, str] | str], add_special_tokens: bool = True) -> list[list[int]]:
        """Each item's ids, tokenized with encode_batch (the GIL released while it runs)."""
        for it in items:
            self.check(it)
        # Three kinds, as encode(prompt, response) always did: a rendered pair without added special
        # tokens (the template writes its own), a pair with them, a string as the caller says.
        groups: dict[bool, list[int]] = {}
        inputs = []
        for k, it in enumerate(items):
            if isinstance(it, tuple) and self.template is not None:
                inputs.append(self.render(*it))
                groups.setdefault(False, []).append(k)
            elif isinstance(it, Conversation):  # rendered text, special tokens as the caller says (vLLM: none)
                inputs.append(self.render_conversation(it))
                self.check(inputs[-1], "messages")  # the template's own text counts too, as on /tokenize
                groups.setdefault(add_special_tokens, []).append(k)
            else:
                inputs.append(it)
                groups.setdefault(isinstance(it, tuple) or add_special_tokens, []).append(k)
        ids: list[list[int]] = [[] for _ in items]
        for special, ks in groups.items():
            for k, one in zip(ks, encode_ids(self.plain.tokenizer, [inputs[k] for k in ks], special)):
                ids[k] = one
        for k, it in enumerate(items):
            if isinstance(it, tuple) and self.template is None and len(ids[k]) > self.max_len:
                try:
                    ids[k] = encode_ids(self.cut_prompt, [it])[0]
                except Exception:  # noqa: BLE001 - the response alone is too long: left cut below
                    pass
        return [x[-self.max_len:] if len(x) > self.max_len else x for x in ids]


async def encode_counted(pool, encoder: Encoder, items: list, add_special_tokens: bool = True,
                         deadline_s: float | None = None) -> list[list[int]]:
    """`encoder.encode` of `items` on `pool` (the core's TokenizePool, `core.tokenizing`): in pieces,
    counted by admission, stopped between pieces when the caller goes, never on the event loop.
    A list of token ids among `items` passes through as it is. What a route that tokenizes calls."""
    from rmscore.core.tokenizing import pieces

    for it in items:  # lengths only: a text over the cap is refused before anything is tokenized
        if not isinstance(it, list):
            encoder.check(it)
    chars = [0 if isinstance(it, list) else sum(map(len, it.texts())) if isinstance(it, Conversation)
             else sum(map(len, it)) if isinstance(it, tuple) else len(it) for it in items]

    def piece(r: range) -> list[list[int]]:
        texts = [items[i] for i in r if not isinstance(items[i], list)]
        done = iter(encoder.encode(texts, add_special_tokens) if texts else [])
        return [list(items[i]) if isinstance(items[i], list) else next(done) for i in r]

    return await pool.run([(lambda r=r: piece(r), sum(chars[i] for i in r)) for r in pieces(chars)], deadline_s)
