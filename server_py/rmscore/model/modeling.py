"""Loading a Hugging Face sequence-classification checkpoint as a reward model.

`RewardModule` is the one definition of "the score of a sequence" that every
runtime reproduces: the PyTorch backends run it, and the ONNX graph is traced
from it. Pooling is done from the attention mask, not from pad-token ids, so
left- and right-padded batches agree and a real token equal to the pad id
(Llama's eos) is still scored.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import torch

ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "distilbert", "electra",
                 "modernbert", "camembert", "albert"}
DECODER_TYPES = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "phi3", "mixtral",
                 "gpt2", "gpt_neox", "olmo", "olmo2", "granite"}


class ModelLoadError(ValueError):
    """A checkpoint that cannot serve as a reward model; the message says why."""


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    family: str  # "encoder" | "decoder"
    pooling: str  # "first" | "last"
    max_sequence_length: int
    pad_token_id: int
    vocab_size: int
    num_attention_heads: int = 0
    hidden_size: int = 0


def inspect_checkpoint(hf_dir: pathlib.Path) -> ModelSpec:
    """Check a checkpoint directory before any weights are read."""
    if not hf_dir.is_dir():
        raise ModelLoadError(f"--model: {str(hf_dir)!r} is not a directory")
    cfg_path = hf_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"--model: {str(hf_dir)!r} has no config.json; not a Hugging Face checkpoint")
    cfg = json.loads(cfg_path.read_text())
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ModelLoadError(f"--model: 'architectures' in {str(cfg_path)!r} must be a list of class names, "
                             f"got {archs!r}")
    arch = archs[0] if archs else ""
    if not arch.endswith("ForSequenceClassification"):
        raise ModelLoadError(
            f"--model: architecture {arch or 'unset'!r} is not a ...ForSequenceClassification model; "
            "a reward model needs a sequence-classification head")
    n_labels = cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2)
    if n_labels != 1:
        raise ModelLoadError(f"--model: num_labels is {n_labels}; a reward model has exactly 1 label")
    if not (hf_dir / "tokenizer.json").is_file():
        raise ModelLoadError(
            f"--model: {str(hf_dir)!r} has no tokenizer.json (a Hugging Face fast tokenizer); "
            "save it with tokenizer.save_pretrained()")
    model_type = cfg.get("model_type", "")
    if model_type in ENCODER_TYPES:
        family, pooling = "encoder", "first"
    elif model_type in DECODER_TYPES:
        family, pooling = "decoder", "last"
    else:
        raise ModelLoadError(f"--model: model_type {model_type!r} is not a supported encoder or decoder family")
    max_len = int(cfg.get("max_position_embeddings") or 512)
    if model_type in {"roberta", "xlm-roberta", "camembert"}:
        max_len -= 2  # RoBERTa offsets positions by pad_token_id + 1
    pad = cfg.get("pad_token_id")
    if pad is None:
        eos = cfg.get("eos_token_id")
        pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    return ModelSpec(arch, family, pooling, min(max_len, 8192), int(pad), int(cfg["vocab_size"]),
                     int(cfg.get("num_attention_heads", 0)), int(cfg.get("hidden_size", 0)))


def load_hf_model(hf_dir: pathlib.Path, attn_implementation: str = "eager"):
    import transformers
    from transformers import AutoModelForSequenceClassification

    transformers.logging.set_verbosity_error()  # the load report is noise for a head we build on purpose
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForSequenceClassification.from_pretrained(
        str(hf_dir), dtype=torch.float32, attn_implementation=attn_implementation)
    return model.eval()


class RewardModule(torch.nn.Module):
    """(input_ids, attention_mask) int64 [B, L] -> scores float32 [B]."""

    def __init__(self, hf_model, spec: ModelSpec):
        super().__init__()
        self.model = hf_model
        self.decoder = spec.family == "decoder"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if not self.decoder:
            # First-token pooling exactly as the model class defines it (BERT's pooler included).
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=torch.zeros_like(input_ids))
            return out.logits[:, 0]
        # Positions from the mask, so a left-padded sequence sees the same positions as unpadded.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                       position_ids=position_ids).last_hidden_state
        logits = self.model.score(hidden)[..., 0]  # [B, L]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (positions * attention_mask).argmax(-1)
        return logits.gather(1, last[:, None])[:, 0]
