"""OpenRLHF's remote reward model protocol on the FastAPI server: `POST /get_reward`.

OpenRLHF (`--remote_rm_url http://HOST:PORT/get_reward`) posts, from
`openrlhf/utils/remote_rm_utils.py`:

    {"query": [full text, ...], "prompts": [prompt text, ...], "labels": [label, ...]}

where each `query` is the policy's prompt + response decoded back to text
(`batch_decode(..., skip_special_tokens=False)`: the policy's own special and pad
tokens are in it), `prompts` the prompts those queries start from, and `labels` the
dataset's labels (unused by a reward model). It reads `rewards` from the answer;
newer versions also read `scores` and `extra_logs`:

    {"rewards": [float, ...], "scores": [float, ...], "extra_logs": {}}

How a query becomes one sequence for this model:
- If its prompt occurs in the query, the text after the prompt's first occurrence
  is the response, and the pair is tokenized as `encode(prompt, response)`, the
  same as the `/v1/score` text path (what comes before the prompt, e.g. left
  padding, is dropped). Anything after the response (EOS or pad strings of the
  policy) stays in the response text.
- Otherwise (no `prompts`, or the prompt is not in the query) the whole query is
  tokenized as one segment, `encode(query)`.
- Too long for `max_sequence_length`: a pair keeps its special tokens and whole
  response and loses the start of its prompt; a response (or single query) that
  alone is too long keeps its last `max_sequence_length` tokens.
Errors use the same JSON shape and HTTP statuses as `/v1/score` (422, 429, 503, ...).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from rmscore.core.errors import ScoreError, invalid
from rmscore.core.validation import SeqInput, check_unicode
from rmscore.core.scoring import ScoringCore
from rmscore.frontends.http_errors import refusal


class GetRewardIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenRLHF versions add fields; unknown ones are ignored
    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def split_query(query: str, prompt: str | None) -> tuple[str, str] | None:
    """(prompt, response) when the prompt occurs in the query, else None (score the query whole)."""
    if not prompt:
        return None
    k = query.find(prompt)
    if k < 0:
        return None
    return prompt, query[k + len(prompt):]


class _Encoder:
    """The model's tokenizer in two settings: untruncated, and cutting a pair's prompt from the left."""

    def __init__(self, tokenizer_json: str, max_len: int):
        from tokenizers import Tokenizer

        self.max_len = max_len
        self.plain = Tokenizer.from_str(tokenizer_json)
        self.plain.no_padding()
        self.plain.no_truncation()
        self.cut_prompt = Tokenizer.from_str(tokenizer_json)
        self.cut_prompt.no_padding()
        self.cut_prompt.enable_truncation(max_len, strategy="only_first", direction="left")

    def encode(self, items: list[tuple[str, str] | str]) -> list[list[int]]:
        out = []
        for it in items:
            ids = (self.plain.encode(*it) if isinstance(it, tuple) else self.plain.encode(it)).ids
            if len(ids) > self.max_len and isinstance(it, tuple):
                try:
                    ids = self.cut_prompt.encode(*it).ids
                except Exception:  # noqa: BLE001 - the response alone is too long: left cut below
                    pass
            out.append(ids[-self.max_len:] if len(ids) > self.max_len else ids)
        return out


def register(app: FastAPI, core: ScoringCore) -> None:
    encoder = _Encoder(core.tokenizer_json, core.repo.max_sequence_length)

    @app.post("/get_reward")
    async def get_reward(body: GetRewardIn):
        t0 = time.perf_counter()
        try:
            if body.prompts is not None and len(body.prompts) != len(body.query):
                raise invalid(f"prompts: {len(body.prompts)} prompts for {len(body.query)} queries")
            items: list[tuple[str, str] | str] = []
            for i, q in enumerate(body.query):
                pair = split_query(q, body.prompts[i] if body.prompts is not None else None)
                if (pair is None and not q) or (pair is not None and not (pair[0] or pair[1])):
                    raise invalid(f"query[{i}]: empty query")
                check_unicode(q, f"query[{i}]")  # the tokenizer takes no unpaired surrogate (JSON "\\ud800")
                items.append(q if pair is None else pair)
            if not items:
                raise invalid("query: empty request, send at least one query")
            core.check_ready()
            ids = await asyncio.to_thread(encoder.encode, items)
            # One OpenRLHF batch may exceed max_sequences_per_request: score it in parts, in order.
            m = core.cfg.max_sequences_per_request
            parts = await asyncio.gather(*(core.score([SeqInput(tokens=x) for x in ids[k:k + m]], "left", None)
                                           for k in range(0, len(ids), m)))
        except ScoreError as e:
            return refusal(core, e, t0)
        core.metrics.request("OK", time.perf_counter() - t0)
        scores = [float(s) for part in parts for s in part.scores]
        return {"rewards": scores, "scores": scores, "extra_logs": {}}
