"""vLLM's pooling API request schemas, as the vLLM routes (vllm_api.py) read them.

Rebuilt from vLLM's source (github.com/vllm-project/vllm), not copied:
- the shared fields: vllm/entrypoints/pooling/base/protocol.py (PoolingBasicRequestMixin,
  ClassifyRequestMixin);
- /classify and /pooling: vllm/entrypoints/pooling/{classify,pooling}/protocol.py (dff4cad3, 343bacaf);
- /score, /v1/score and /rerank, /v1/rerank, /v2/rerank: vllm/entrypoints/pooling/scoring/protocol.py
  at 53158688 (ScoringRequestMixin, the four ScoreRequest spellings, RerankRequest) and the router
  beside it at facb56e2 (one handler for /score and /v1/score, one for the three rerank paths).
Unknown fields are accepted and ignored, as vLLM's OpenAIBaseModel does (`return_documents`, sent by
Jina- and Cohere-style clients, is one: vLLM always returns each document's text).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rmscore.core.errors import invalid
from rmscore.frontends.body_lists import list_of


class VllmRequest(BaseModel):
    """PoolingBasicRequestMixin + ClassifyRequestMixin: the fields every pooling request has."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    priority: int = 0
    use_activation: bool | None = None


class ChatOptions(BaseModel):
    """ChatRequestOptionsMixin (pooling/base/protocol.py at 020638a6): how `messages` are rendered
    with the chat template. `chat_template` (or one in `chat_template_kwargs`) is refused, as vLLM
    refuses it without --trust-request-chat-template, which rmscore does not offer."""

    model_config = ConfigDict(extra="allow")
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def check_chat(self) -> None:
        if self.continue_final_message and self.add_generation_prompt and "add_generation_prompt" in self.model_fields_set:
            raise invalid("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        if self.chat_template is not None or (self.chat_template_kwargs or {}).get("chat_template") is not None:
            raise invalid("chat_template: Chat template is passed with request, but --trust-request-chat-template "
                          "is not set. Refused request with untrusted chat template.")

    def chat_options(self) -> tuple:
        """What ChatTemplate.render takes: the kwargs, then the two flags over them (vLLM's merge_kwargs)."""
        kw = {k: v for k, v in (self.chat_template_kwargs or {}).items()
              if k not in ("messages", "tokenize", "chat_template")}
        # A default add_generation_prompt (true on /tokenize) gives way to a continue_final_message sent.
        generation = self.add_generation_prompt and not (
            self.continue_final_message and "add_generation_prompt" not in self.model_fields_set)
        kw.update(add_generation_prompt=generation, continue_final_message=self.continue_final_message)
        if getattr(self, "tools", None) is not None:  # TokenizeChatRequest's tools, which the template sees
            kw["tools"] = self.tools
        return tuple(kw.items())


class ClassifyIn(VllmRequest, ChatOptions):
    """ClassificationCompletionRequest (`input`) or ClassificationChatRequest (`messages`)."""

    input: list_of(int, None) | list_of(list_of(int, None)) | str | list_of(str) | None = None
    messages: list_of(dict[str, Any]) | None = None
    add_special_tokens: bool | None = None  # vLLM: True for `input`, False for `messages`


class PoolingIn(ClassifyIn):
    """PoolingCompletionRequest / PoolingChatRequest: also EmbedRequestMixin's fields, checked as
    PoolingParams.verify checks them for the classify task, and its encoding of the output."""

    task: str | None = None
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    endianness: Literal["native", "little", "big"] = "native"


class TokenizeIn(ChatOptions):
    """TokenizeCompletionRequest (`prompt`) or TokenizeChatRequest (`messages`; there vLLM's
    add_generation_prompt defaults to true, serve/tokenize/protocol.py at 030ea52e)."""

    model: str | None = None
    add_generation_prompt: bool = True
    tools: list_of(dict[str, Any]) | None = None
    prompt: str | None = None
    messages: list_of(dict[str, Any]) | None = None
    add_special_tokens: bool | None = None  # vLLM: True for `prompt`, False for `messages`
    return_token_strs: bool | None = False


ScoreInputs = str | list_of(str)
#: vLLM's default 0 is "no per-text cut"; a negative count has no meaning there, so it is refused.
TokensPerText = Annotated[int, Field(ge=0)]


class ScoringIn(VllmRequest):
    """ScoringRequestMixin: a text-pair request. `max_tokens_per_query` / `max_tokens_per_doc` keep
    that many leading tokens of each first / second text before the pair is built (0: no cut)."""

    max_tokens_per_query: TokensPerText = 0
    max_tokens_per_doc: TokensPerText = 0


class ScoreIn(ScoringIn):
    """ScoreTextRequest (text_1/text_2) and its spellings data_1/data_2, queries/documents, queries/items."""

    text_1: ScoreInputs | None = None
    text_2: ScoreInputs | None = None
    data_1: ScoreInputs | None = None
    data_2: ScoreInputs | None = None
    queries: ScoreInputs | None = None
    documents: ScoreInputs | None = None
    items: ScoreInputs | None = None

    def sides(self) -> tuple[list[str], list[str], tuple[str, str]]:
        """The first texts, the second texts, and the two fields' names (for messages)."""
        for a, b in (("text_1", "text_2"), ("data_1", "data_2"), ("queries", "documents"), ("queries", "items")):
            one, two = getattr(self, a), getattr(self, b)
            if one is not None and two is not None:
                return ([one] if isinstance(one, str) else one), ([two] if isinstance(two, str) else two), (a, b)
        raise invalid("body: send text_1 and text_2 (or data_1/data_2, queries/documents, queries/items)")


class RerankIn(ScoringIn):
    """RerankRequest: one `query` against each of `documents`; `top_n` > 0 keeps that many results."""

    query: str
    documents: ScoreInputs
    top_n: int = 0

    def document_list(self) -> list[str]:
        return [self.documents] if isinstance(self.documents, str) else self.documents
