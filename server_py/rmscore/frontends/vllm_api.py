"""vLLM's pooling API on the FastAPI server: `POST /classify`, `/score` and `/v1/score`, `/rerank`,
`/v1/rerank` and `/v2/rerank`, `/pooling`, `/tokenize`, `GET /v1/models`, `/health`.

The request schemas (vllm_protocol.py) and response schemas are vLLM's (vllm/entrypoints/pooling/
{classify,pooling,scoring}/protocol.py and base/protocol.py; the score and rerank responses as
scoring/serving.py at a1140c1b builds them; docs/frameworks/vllm-api.md cites the commits), so a
client written for a vLLM reward or cross-encoder server works unchanged. Unknown fields are accepted and
ignored, as vLLM's OpenAIBaseModel does. What differs, on purpose:
- a reward model has one output: `num_classes` is 1 and `probs` (and /pooling's `data`) one value;
  with vLLM's default `use_activation` (None, i.e. true) it is the model's activation of the reward
  (sigmoid; the identity for `problem_type: regression` or a sentence-transformers `activation_fn`
  of Identity in its config.json, as vLLM's get_act_fn decides), with `use_activation: false` the
  raw reward rmscore's own route returns;
- the id is `<route>-<X-Request-Id>` (or a random hex), as vLLM's `_base_request_id` makes it
  (`score-` for /rerank too: vLLM's ServingScores serves both under that prefix);
- /score and /rerank pairs: at most max_sequences_per_request a request (400 otherwise, before any
  tokenizing), each distinct text tokenized once (vllm_pairs.py);
- `GET /v1/models` lists the one model as vLLM's ModelList does, `POST /tokenize` answers as vLLM's,
  and `GET /health` answers 200 with an empty body while serving (503 otherwise), a probe without a
  token as /healthz;
- text too long for the model is cut (from the left) instead of refused, so one long rollout never
  stops training; `truncate_prompt_tokens` cuts to that many tokens on `truncation_side`, else on the
  tokenizer's side (its tokenizer_config.json; right by default), as vLLM does, and a value above the
  model's maximum is refused (400), as vLLM does;
- what vLLM refuses is refused, what it honours is honoured (VllmRoutes.check_params: priority,
  softmax/activation, and on /pooling normalize, dimensions, task, encoding_format base64);
- errors have vLLM's shape, `{"error": {"message", "type", "param", "code"}}`, and a bad request is
  400 as there (http_errors.py; which paths are vLLM's: http_routes.py, read from these routes);
  overload and not-ready keep rmscore's 429 and 503.
Text goes through reward_text.Encoder, so --strip-string and --chat-template apply here too, and
`messages` are rendered whole with the reward model's chat template (--chat-template, else the
model repository's own; refused without one) as vLLM's chat requests are: add_generation_prompt,
continue_final_message and chat_template_kwargs honoured, `chat_template` refused (vllm_protocol.ChatOptions).
"""

from __future__ import annotations

import base64
import json
import math
import time
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response

from rmscore.core.errors import ScoreError, invalid
from rmscore.core.scoring import SERVING, ScoringCore, sent_bytes
from rmscore.core.validation import SeqInput, check_unicode
from rmscore.frontends.http_errors import refusal
from rmscore.frontends.reward_text import Conversation, Encoder, encode_counted
from rmscore.frontends.vllm_pairs import broadcast, encode_pairs, tokenized_chars
from rmscore.frontends.vllm_protocol import (ClassifyIn, PoolingIn, RerankIn, ScoreIn, ScoringIn, TokenizeIn,
                                              VllmRequest)

#: vLLM's paths for its score and rerank handlers (scoring/api_router.py at facb56e2).
SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


def _messages(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """vLLM's `messages` as the template sees them: every turn, each message's other fields kept; a
    content given as parts becomes its text parts joined by newlines (vLLM's "string" content
    format, chat_utils.py); each text checked (Unicode) before anything is rendered."""
    if not messages:
        raise invalid("messages: empty conversation")
    out = []
    for i, m in enumerate(messages):
        c = m.get("content")
        if isinstance(c, list):  # content parts: their "text" fields, each a string (else 400, not a 500)
            parts = [p.get("text", "") for p in c if isinstance(p, dict)]
            bad = next((j for j, t in enumerate(parts) if not isinstance(t, str)), None)
            if bad is not None:
                raise invalid(f"messages[{i}].content[{bad}].text: expected text")
            c = "\n".join(parts)
        if c is not None and not isinstance(c, str):
            raise invalid(f"messages[{i}].content: expected text")
        if c is not None:
            check_unicode(c, f"messages[{i}].content")
        out.append({**m, "content": c})
    return tuple(out)


def conversation(body: ClassifyIn | TokenizeIn) -> Conversation:
    """The request's messages and chat options, checked, to be rendered whole (reward_text.Encoder)."""
    body.check_chat()
    return Conversation(_messages(body.messages), body.chat_options())


class VllmRoutes:
    def __init__(self, core: ScoringCore, encoder: Encoder):
        self.core, self.encoder = core, encoder
        cfg = json.loads((core.repo.path / "hf" / "config.json").read_text()) \
            if (core.repo.path / "hf" / "config.json").is_file() else {}
        self.label = (cfg.get("id2label") or {}).get("0", "LABEL_0")
        self.identity = _identity_activation(cfg)
        tok_cfg_path = core.repo.path / "hf" / "tokenizer_config.json"
        tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.is_file() else {}
        # truncate_prompt_tokens without truncation_side cuts on the tokenizer's side, as vLLM does
        # (Hugging Face's default: right).
        self.truncation_side = tok_cfg.get("truncation_side") or "right"

    @staticmethod
    def check_params(body: VllmRequest) -> None:
        """What vLLM refuses rather than ignores on these routes (vllm-project/vllm at 0235532e,
        pooling_params.py verify and base/protocol.py): a non-zero `priority` without priority
        scheduling; on /pooling the removed `normalize` and task names, and `dimensions`,
        `step_tag_id` or `returned_token_ids` (the classify task takes only `use_activation`).
        The deprecated `softmax` / `activation` stand in for `use_activation`, as get_use_activation
        reads them."""
        extra = body.model_extra or {}
        if body.priority != 0:
            raise invalid(f"priority: got priority {body.priority} but priority scheduling is not enabled")
        if body.use_activation is None:
            for old in ("softmax", "activation"):
                if isinstance(extra.get(old), bool):
                    body.use_activation = extra[old]
                    break
        if not isinstance(body, PoolingIn):
            return
        if "normalize" in extra:
            raise invalid("normalize: Parameter `normalize` was removed; use `use_activation` instead.")
        if body.task not in (None, "classify"):
            raise invalid(f"task: {body.task!r} is not supported by this reward model, which serves 'classify'")
        given = {"dimensions": body.dimensions, "step_tag_id": extra.get("step_tag_id"),
                 "returned_token_ids": extra.get("returned_token_ids")}
        unsupported = [k for k, v in given.items() if v is not None]
        if unsupported:
            raise invalid(f"{unsupported[0]}: Task classify only supports ['use_activation'] parameters, "
                          f"does not support {unsupported} parameters")

    @staticmethod
    def encode(body: PoolingIn, values: list[float]) -> list[float] | str:
        """/pooling's `data`: the floats, or with encoding_format base64 their bytes in embed_dtype
        and endianness, base64-encoded, as vLLM's serial_utils encodes a tensor."""
        if body.encoding_format == "float":
            return values
        order = {"native": "=", "little": "<", "big": ">"}[body.endianness]
        x = np.asarray(values, dtype=np.float32)
        if body.embed_dtype == "bfloat16":  # the upper half of a float32, rounded to nearest even
            bits = x.view(np.uint32)
            raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.dtype(f"{order}u2"))
        else:
            raw = x.astype(np.dtype(f"{order}{'f4' if body.embed_dtype == 'float32' else 'f2'}"))
        return base64.b64encode(raw.tobytes()).decode("ascii")

    def check_truncation(self, body: VllmRequest) -> None:
        """vLLM refuses a truncate_prompt_tokens above the model's maximum (400). 0 keeps no tokens:
        vLLM's renderer (vllm/entrypoints/renderer.py, RenderConfig) then renders no prompt at all and
        answers no results, which a trainer zipping rewards to rollouts would not notice until later;
        here it is refused, on either truncation side."""
        k, most = body.truncate_prompt_tokens, self.core.repo.max_sequence_length
        if k == 0:
            raise invalid("truncate_prompt_tokens: 0 keeps no tokens, so nothing would be scored; "
                          "send a positive value, or -1 for the model's maximum")
        if k is not None and k > most:
            raise invalid(f"truncate_prompt_tokens: {k} is greater than the model's max_model_len ({most}); "
                          "send a smaller value, or -1 for the maximum")

    def _cut(self, ids: list[int], body: VllmRequest) -> list[int]:
        k = body.truncate_prompt_tokens
        if k is None or k == -1 or len(ids) <= k:
            return ids
        return ids[:k] if (body.truncation_side or self.truncation_side) == "right" else ids[-k:]

    def inputs(self, body: ClassifyIn) -> list[tuple[str, str] | str | list[int]]:
        if body.messages is not None:
            return [conversation(body)]
        x = body.input
        if x is None:
            raise invalid("body: send input or messages")
        if isinstance(x, str) or (isinstance(x, list) and x and isinstance(x[0], int)):
            x = [x]
        if not x:
            raise invalid("input: empty input")
        return [self.encoder.strip(s) if isinstance(s, str) else s for s in x]

    async def score(self, items: list, body: VllmRequest, add_special_tokens: bool = True) -> tuple[list, int]:
        """Raw rewards of `items` (text, pairs or token ids) and their total token count."""
        for i, it in enumerate(items):
            for s in (it.texts() if isinstance(it, Conversation) else it if isinstance(it, tuple) else (it,)):
                if isinstance(s, str):
                    check_unicode(s, f"input[{i}]")
            if not it or it == ("", ""):
                raise invalid(f"input[{i}]: empty input")
            if isinstance(it, list):  # before truncate_prompt_tokens cuts it, as the core checks uncut ids
                self.core.validator.check_sent_ids(len(it), f"sequences[{i}]")
        self.check_truncation(body)
        tokens = 0

        async def prepare() -> list[SeqInput]:
            # On the core's tokenizing pool: counted by admission, stopped when the caller goes.
            nonlocal tokens
            ids = [self._cut(x, body) for x in await encode_counted(self.core.tokenizing, self.encoder, items,
                                                                    add_special_tokens)]
            tokens = sum(map(len, ids))
            return [SeqInput(tokens=x) for x in ids]

        # One call into the core: admission first (a refusal costs no tokenizing), then prepare, then parts.
        return await self.core.score_prepared(prepare, "left", sent_bytes(items)), tokens

    async def score_pairs(self, first: list[str], second: list[str], names: tuple[str, str],
                          body: ScoringIn) -> tuple[list, int]:
        """Raw rewards of vLLM's text pairs (1:1, 1:N or N:N) and their total token count. The pairs
        are counted, and the request admitted, before any text is tokenized; then each distinct text
        is tokenized once (vllm_pairs.py), off the event loop."""
        pairs = broadcast(first, second, self.core.cfg.max_sequences_per_request, names)
        self.check_truncation(body)
        held = sum(map(len, {t for pair in pairs for t in pair}))  # the body holds each text once
        tokens = 0

        async def prepare() -> list[SeqInput]:
            nonlocal tokens
            ids = await self.core.tokenizing.run([(lambda: encode_pairs(self.encoder, pairs, body.max_tokens_per_query,
                                                                         body.max_tokens_per_doc, names),
                                                   tokenized_chars(self.encoder, pairs))], None)
            ids = [self._cut(x, body) for x in ids]
            tokens = sum(map(len, ids))
            return [SeqInput(tokens=x) for x in ids]

        return await self.core.score_prepared(prepare, "left", held), tokens

    def rerank_response(self, body: RerankIn, values: list[float], tokens: int, request: Request) -> dict:
        """vLLM's RerankResponse: every document with its index and text, best first (a stable sort:
        ties keep the documents' order), the first `top_n` when that is above 0."""
        docs = body.document_list()
        results = sorted(({"index": i, "document": {"text": d, "multi_modal": None}, "relevance_score": v}
                          for i, (d, v) in enumerate(zip(docs, values))),
                         key=lambda r: r["relevance_score"], reverse=True)
        if 0 < body.top_n < len(results):
            results = results[:body.top_n]
        return {"id": f"score-{request.headers.get('x-request-id') or uuid.uuid4().hex}", "model": self.core.repo.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}

    def envelope(self, prefix: str, data: list, tokens: int, request: Request) -> dict:
        return {"id": f"{prefix}-{request.headers.get('x-request-id') or uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": self.core.repo.name, "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                          "prompt_tokens_details": None, "completion_tokens_details": None}}

    def activation(self, body: VllmRequest, r: float) -> float:
        if body.use_activation is False or self.identity:
            return r
        return 1.0 / (1.0 + math.exp(-r))

    def tokenize(self, body: TokenizeIn) -> dict:
        """vLLM's TokenizeResponse: a conversation rendered whole with the chat template (as the pooling
        routes render it, though /tokenize adds the generation prompt unless told not to, as vLLM's),
        or a prompt; the whole tokenization, not cut to the model's length, as in vLLM."""
        if body.messages is not None:
            text = self.encoder.render_conversation(conversation(body))
            self.encoder.check(text, "messages")
            special = body.add_special_tokens if body.add_special_tokens is not None else False
            ids = self.encoder.plain.encode(text, add_special_tokens=special).ids
        elif body.prompt is not None:
            check_unicode(body.prompt, "prompt")
            special = body.add_special_tokens if body.add_special_tokens is not None else True
            ids = self.encoder.plain.encode(self.encoder.strip(body.prompt), add_special_tokens=special).ids
        else:
            raise invalid("body: send prompt or messages")
        strs = [self.encoder.plain.id_to_token(i) for i in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.core.repo.max_sequence_length, "tokens": ids,
                "token_strs": strs}

    def models(self) -> dict:
        """vLLM's ModelList with the one model's card."""
        now = int(time.time())
        return {"object": "list", "data": [{
            "id": self.core.repo.name, "object": "model", "created": now, "owned_by": "rmscore",
            "root": self.core.repo.name, "parent": None, "max_model_len": self.core.repo.max_sequence_length,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                            "allow_create_engine": False, "allow_sampling": False, "allow_logprobs": False,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}]}


def _identity_activation(cfg: dict) -> bool:
    """Whether vLLM's activation for this one-label classifier is the identity: `problem_type`
    regression first, then a sentence-transformers cross-encoder's `activation_fn`; else sigmoid."""
    problem = cfg.get("problem_type")
    if problem is not None:
        return problem == "regression"
    act = ((cfg.get("sentence_transformers") or {}).get("activation_fn")
           or cfg.get("sbert_ce_default_activation_function") or "")
    return act.endswith(".Identity")


def register(app: FastAPI, core: ScoringCore, encoder: Encoder) -> None:
    routes = VllmRoutes(core, encoder)

    async def answer(work):
        t0 = time.perf_counter()
        try:
            out = await work()
        except ScoreError as e:
            return refusal(core, e, t0, vllm=True)
        core.metrics.request("OK", time.perf_counter() - t0)
        return out

    async def per_input(body: ClassifyIn, request: Request, prefix: str, item) -> dict:
        """/classify and /pooling: one `item(index, reward)` per input (text, ids or the conversation)."""
        async def work():
            routes.check_params(body)
            special = body.add_special_tokens if body.add_special_tokens is not None else body.messages is None
            rewards, n = await routes.score(routes.inputs(body), body, special)
            return routes.envelope(prefix, [item(i, r) for i, r in enumerate(rewards)], n, request)
        return await answer(work)

    @app.post("/classify")
    async def classify(body: ClassifyIn, request: Request):
        return await per_input(body, request, "classify", lambda i, r: {
            "index": i, "label": routes.label, "probs": [routes.activation(body, r)], "num_classes": 1})

    async def score(body: ScoreIn, request: Request):
        async def work():
            routes.check_params(body)
            rewards, n = await routes.score_pairs(*body.sides(), body)
            data = [{"index": i, "object": "score", "score": routes.activation(body, r)}
                    for i, r in enumerate(rewards)]
            return routes.envelope("score", data, n, request)
        return await answer(work)

    async def rerank(body: RerankIn, request: Request):
        async def work():
            routes.check_params(body)
            rewards, n = await routes.score_pairs([body.query], body.document_list(), ("query", "documents"), body)
            return routes.rerank_response(body, [routes.activation(body, r) for r in rewards], n, request)
        return await answer(work)

    # vLLM serves each under all of these paths with one handler (scoring/api_router.py).
    for path in SCORE_PATHS:
        app.add_api_route(path, score, methods=["POST"])
    for path in RERANK_PATHS:
        app.add_api_route(path, rerank, methods=["POST"])

    @app.post("/pooling")
    async def pooling(body: PoolingIn, request: Request):
        # vLLM pools a sequence classifier with its "classify" task: the activation applies unless
        # use_activation is false (PoolingParams' default for classify is true).
        return await per_input(body, request, "pooling", lambda i, r: {
            "index": i, "object": "pooling", "data": routes.encode(body, [routes.activation(body, r)])})

    @app.post("/tokenize")
    async def tokenize(body: TokenizeIn):
        async def work():
            # On the core's tokenizing pool, counted by admission by its characters (a conversation's
            # by its text as sent, an upper bound).
            chars = len(body.prompt) if body.prompt is not None else len(str(body.messages or ""))
            return (await core.tokenizing.run([(lambda: [routes.tokenize(body)], chars)], None))[0]
        return await answer(work)

    @app.get("/v1/models")
    async def models():
        return routes.models()

    @app.get("/health")
    async def health():
        return Response(status_code=200 if core.state == SERVING else 503)
