"""OpenRLHF's remote reward model protocol on the FastAPI server: `POST /get_reward`.

OpenRLHF (docs/frameworks/openrlhf.md gives the versions) posts

    {"query": [full text, ...], "prompts": [prompt text, ...], "labels": [label, ...]}

where each `query` is the policy's prompt + response decoded back to text
(`skip_special_tokens=False`: the policy's own special and pad tokens are in it), `prompts` the
prompts those queries start from, and `labels` the dataset's labels (unused by a reward model).
Up to 0.9.0 one request carries a whole rollout batch (e.g. 8192 queries), split over several URLs
with ceil(n/k), so a shard may be empty; since 0.9.1 one request carries one query. It reads
`rewards` (newer versions also `scores` and `extra_logs`):

    {"rewards": [float, ...], "scores": [float, ...], "extra_logs": {}}

How a query becomes one sequence (reward_text.py): the --strip-string strings are removed; if its
prompt (or the prompt's tail, for a prompt cut from the left) occurs in it, it is scored as the pair
(prompt, rest of the query), rendered with --chat-template when set; else as one segment, which
is counted (rmscore_get_reward_sequences_total{format}) and logged, since the reward model then
sees another text format than the other samples. An empty `query` is answered with empty lists.

A request larger than the queue is fed to it in parts of max_sequences_per_request as earlier
parts finish (`ScoringCore.score_in_parts`), and answered once. Errors use the same JSON shape and HTTP
statuses as /rmscore/v1/score (422, 429, 503, ...).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from rmscore.core.errors import ScoreError, invalid
from rmscore.core.runtime import progress
from rmscore.core.tokenizing import check_chars, pieces
from rmscore.core.validation import SeqInput, check_unicode
from rmscore.core.scoring import ScoringCore, sent_bytes
from rmscore.frontends.body_lists import list_of
from rmscore.frontends.http_errors import refusal
from rmscore.frontends.reward_text import Encoder, split_query

FORMAT_METRIC = "rmscore_get_reward_sequences_total"
#: At most one "scored as one segment" log line per this many seconds (0.9.1+ sends one query per request).
LOG_EVERY_S = 10.0


class GetRewardIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenRLHF versions add fields; unknown ones are ignored
    query: list_of(str)
    prompts: list_of(str) | None = None
    labels: list_of(Any) | None = None


class FormatCount:
    """Counts pair vs one-segment sequences, and says so in the log when a query lost its pair form."""

    def __init__(self, core: ScoringCore):
        self.series = {f: core.metrics._child(FORMAT_METRIC, format=f) for f in ("pair", "one_segment")}
        self.pending, self.seen, self.example, self.last_log = 0, 0, "", 0.0

    def add(self, items: list, prompts_sent: bool) -> None:
        single = [i for i, it in enumerate(items) if not isinstance(it, tuple)]
        self.series["pair"].inc(len(items) - len(single))
        self.series["one_segment"].inc(len(single))
        if not (single and prompts_sent):  # no prompts sent: one segment is what the caller asked for
            return
        self.pending += len(single)
        self.seen += len(items)
        self.example = self.example or f"query[{single[0]}]"
        now = time.monotonic()
        if now - self.last_log >= LOG_EVERY_S:
            progress(f"get_reward: {self.pending} of {self.seen} queries scored as one segment, not as a "
                     f"prompt/response pair: their prompt is not in the query (e.g. {self.example}); "
                     "see --strip-string and docs/frameworks/openrlhf.md")
            self.pending, self.seen, self.example, self.last_log = 0, 0, "", now


def check(body: GetRewardIn, max_chars: int) -> None:
    """What is refused from lengths alone, before any text is read (INVALID_ARGUMENT)."""
    if body.prompts is not None and len(body.prompts) != len(body.query):
        raise invalid(f"prompts: {len(body.prompts)} prompts for {len(body.query)} queries")
    for name, texts in (("query", body.query), ("prompts", body.prompts or ())):
        for i, text in enumerate(texts):
            check_chars(text, max_chars, f"{name}[{i}]")


def parse(body: GetRewardIn, encoder: Encoder, indices: range | None = None) -> list[tuple[str, str] | str]:
    """Each query (of `indices`, else all) as a (prompt, response) pair or one segment; ScoreError
    INVALID_ARGUMENT."""
    if indices is None:
        check(body, encoder.max_chars)
    items: list[tuple[str, str] | str] = []
    for i in indices if indices is not None else range(len(body.query)):
        raw = body.query[i]
        check_unicode(raw, f"query[{i}]")  # the tokenizer takes no unpaired surrogate (JSON "\\ud800")
        if body.prompts is not None:
            check_unicode(body.prompts[i], f"prompts[{i}]")
        q = encoder.strip(raw)
        pair = split_query(q, encoder.strip(body.prompts[i]) if body.prompts is not None else None)
        if (pair is None and not q) or (pair is not None and not (pair[0] or pair[1])):
            raise invalid(f"query[{i}]: empty query")
        items.append(q if pair is None else pair)
    return items


def register(app: FastAPI, core: ScoringCore, encoder: Encoder) -> None:
    formats = FormatCount(core)

    async def tokenize(body: GetRewardIn) -> list[SeqInput]:
        """The queries parsed (strip, prompt search) and tokenized on the core's tokenizing pool in
        pieces: counted by admission, never on the event loop, stopped between pieces when the client
        goes (core/tokenizing.py)."""
        chars = [len(q) + (len(body.prompts[i]) if body.prompts is not None else 0) for i, q in enumerate(body.query)]

        def piece(r: range) -> list:
            items = parse(body, encoder, r)
            return list(zip(items, encoder.encode(items)))

        done = await core.tokenizing.run([(lambda r=r: piece(r), sum(chars[i] for i in r)) for r in pieces(chars)],
                                         None)
        formats.add([it for it, _ in done], body.prompts is not None)
        return [SeqInput(tokens=x) for _, x in done]

    @app.post("/get_reward")
    async def get_reward(body: GetRewardIn):
        t0 = time.perf_counter()
        try:
            check(body, encoder.max_chars)  # lengths only: a 15 MiB query is refused before it is read
            if not body.query:  # an empty shard of ceil(n/k) over k URLs: nothing to score
                core.metrics.request("OK", time.perf_counter() - t0)
                return {"rewards": [], "scores": [], "extra_logs": {}}
            # One call into the core: admission, then tokenizing (so a refusal costs none), then parts.
            # Held as sent, a byte per character, from before tokenizing until answered.
            nbytes = sent_bytes(body.query) + sent_bytes(body.prompts or [])
            scores = await core.score_prepared(lambda: tokenize(body), "left", nbytes)
        except ScoreError as e:
            return refusal(core, e, t0)
        core.metrics.request("OK", time.perf_counter() - t0)
        return {"rewards": scores, "scores": scores, "extra_logs": {}}
