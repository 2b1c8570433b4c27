"""What GetModelInfo (gRPC) and GET /v1/model (HTTP) say: one builder for both Python front ends."""

from __future__ import annotations

import functools
import pathlib

from rmscore_client.chat import ChatTemplateError, read_pretrained, special_tokens

from rmscore.core.scoring import ScoringCore


def model_info(core: ScoringCore) -> dict:
    """The manifest's facts and this server's settings, in the contract's field names (HTTP keeps
    this order in its JSON), the published chat template last. The tokenizer is not here: gRPC adds `tokenizer_json`, HTTP serves it
    at /v1/tokenizer."""
    m = core.repo.manifest
    return {"name": m["name"], "version": m["version"], "architecture": m["architecture"],
            "family": m["family"], "pooling": m["pooling"], "max_sequence_length": m["max_sequence_length"],
            "pad_token_id": m["pad_token_id"], "vocab_size": m["vocab_size"],
            "max_sequences_per_request": core.cfg.max_sequences_per_request,
            "text_format": m["tokenizer"]["text_format"], "accepts_text": True,
            "server": core.cfg.server_label, "backend": core.cfg.backend, "device": core.cfg.device,
            "precision": core.cfg.precision, **ranking(m, core.cfg.precision),
            **published_template(core.cfg.model, core.cfg.chat_template)}


@functools.lru_cache(maxsize=8)
def published_template(model: pathlib.Path, spec: str | None = None) -> dict:
    """`chat_template` and `special_tokens` as the server publishes them (read once): the template a
    conversation is rendered with here, as text: the file of --chat-template FILE (HTTP only), else
    the model repository's own (hf/chat_template.jinja, else hf/tokenizer_config.json's; the C++
    server reads the same), "" when there is none; the tokenizer's named special tokens either way."""
    hf = pathlib.Path(model) / "hf"
    tokens = special_tokens(hf)
    text = ""
    if spec and spec != "model":
        try:
            text = pathlib.Path(spec).read_text(encoding="utf-8")
        except OSError:  # the server refused to start on it (reward_text.chat_template)
            pass
    else:
        try:
            text, _ = read_pretrained(hf)
        except ChatTemplateError:
            pass
    return {"chat_template": text, "special_tokens": tokens}


def ranking(manifest: dict, precision: str) -> dict:
    """The exporter's held-out ranking figures for `precision` (parity.PRECISION.ranking)."""
    if precision == "fp32":
        return {"ranking_spearman": 1.0, "ranking_pairwise_agreement": 1.0, "ranking_max_abs_diff": 0.0}
    r = manifest["parity"].get(precision, {}).get("ranking", {})
    return {"ranking_spearman": r.get("spearman", 0.0), "ranking_pairwise_agreement":
            r.get("pairwise_order_agreement", 0.0), "ranking_max_abs_diff": r.get("max_abs_diff", 0.0)}
