"""Reduced-precision graphs and the ranking-accuracy gate they must pass at export.

For RLHF what matters is whether a reward model still *orders* responses the way fp32 does, so a
reduced-precision graph is judged on a held-out set of prompt/response pairs, tokenized with the
model's own tokenizer and disjoint from the calibration texts (default_model.calibration_pairs),
by three figures against the fp32 graph: Spearman's rank correlation over all scores, pairwise
order agreement (for every two responses to the same prompt, does it order them as fp32 does) and
the largest absolute score difference. Below the gate, export writes nothing.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
from dataclasses import dataclass

import numpy as np

from rmscore.model.ort_eval import ort_session, parity, scores_alone

#: Gate defaults (issue 18): a 0.5% rank disagreement already changes which responses a policy learns from.
DEFAULT_MIN_SPEARMAN = 0.995
DEFAULT_MIN_PAIRWISE = 0.99
#: Precisions an exported ONNX graph may have. fp16 is a GPU graph (CUDA EP); int8 runs on the CPU.
GRAPH_PRECISIONS = ("int8", "fp16")


class GateError(RuntimeError):
    pass


@dataclass(frozen=True)
class Gate:
    min_spearman: float = DEFAULT_MIN_SPEARMAN
    min_pairwise: float = DEFAULT_MIN_PAIRWISE

    def __post_init__(self) -> None:
        for flag, v in (("--gate-spearman", self.min_spearman), ("--gate-pairwise", self.min_pairwise)):
            if not (isinstance(v, (int, float)) and -1.0 <= v <= 1.0):
                raise ValueError(f"{flag}: must be a number in [-1, 1], got {v!r}")

    def passes(self, fig: dict) -> bool:
        return fig["spearman"] >= self.min_spearman and fig["pairwise_order_agreement"] >= self.min_pairwise

    def check(self, what: str, fig: dict) -> None:
        """Raises GateError quoting the figures and the gate when `fig` falls below it."""
        if not self.passes(fig):
            raise GateError(f"ranking gate: {what} {describe(fig)}; the gate is Spearman >= {self.min_spearman} "
                            f"and pairwise agreement >= {self.min_pairwise} (--gate-spearman, --gate-pairwise); "
                            "nothing was written")

    def as_dict(self) -> dict:
        return {"min_spearman": self.min_spearman, "min_pairwise_order_agreement": self.min_pairwise}


def describe(fig: dict) -> str:
    return (f"Spearman {fig['spearman']:.4f}, pairwise agreement {fig['pairwise_order_agreement']:.4f} "
            f"over {fig['pairs']} pairs, max abs diff {fig['max_abs_diff']:.3g}")


# Held-out texts: none of these appear in default_model.calibration_pairs(), which calibrates
# both the default head and static int8 quantization.
_HELDOUT = [
    ("How do vaccines train the immune system?",
     "A vaccine shows the immune system a harmless piece or copy of a pathogen, so it makes antibodies and "
     "memory cells that respond quickly if the real infection ever arrives."),
    ("Write a short poem about the sea at night.",
     "Dark water breathes beneath the moon, / the tide keeps time with a silver tune, / and every wave "
     "folds back the light / to hide it in the arms of night."),
    ("What is 15% of 240?", "15% of 240 is 36, because 0.15 times 240 equals 36."),
    ("Recommend a book for someone who enjoyed The Hobbit.",
     "Try A Wizard of Earthsea by Ursula K. Le Guin: a coming-of-age fantasy with a quest, dragons and "
     "a wise, quiet tone much like Tolkien's."),
    ("How can I make my bread rise better?",
     "Use fresh yeast, keep the dough somewhere warm, knead it long enough to build gluten, and give it "
     "time: a slow second rise improves both height and flavour."),
    ("Explain what a hash table is.",
     "A hash table stores key-value pairs in an array, using a hash function to turn each key into an "
     "index, so lookups, inserts and deletes take constant time on average."),
    ("What should I pack for a weekend hiking trip?",
     "Pack layered clothing, a rain jacket, sturdy boots, a map, water and a filter, snacks, a first-aid "
     "kit, a headlamp and a sleeping bag suited to the night temperatures."),
    ("Why do cats purr?",
     "Cats purr when content, but also when stressed or hurt; the vibration may soothe them and even "
     "help heal bones and tissue."),
    ("Convert 100 degrees Fahrenheit to Celsius.",
     "Subtract 32 and multiply by 5/9: (100 - 32) x 5/9 is about 37.8 degrees Celsius."),
    ("Give me advice on learning a new language.",
     "Practise a little every day, speak with native speakers early, learn the most common words first, "
     "and listen to music or podcasts in the language."),
    ("What caused the 2008 financial crisis?",
     "Risky mortgage lending, securities built on those mortgages, high leverage at banks and weak "
     "regulation combined; when house prices fell, losses spread through the financial system."),
    ("Describe how a bill becomes a law in the United States.",
     "A bill is introduced in Congress, reviewed in committee, passed by both the House and the Senate "
     "in the same form, and then signed by the President or passed over a veto."),
]
_POOR = [
    "I'm not sure, maybe look it up.",
    "Bananas are a good source of potassium.",
    "no",
    "As an AI I cannot help with that request.",
    "The weather today is sunny with a light breeze, and the forecast says it will stay that way.",
]
_FILLER = ("This is an important topic that many people ask about. There are several things to consider, "
           "and it helps to think about each of them carefully. ")


def heldout_texts() -> tuple[list[tuple[str, str]], list[tuple[int, int]]]:
    """(prompt, response) texts and the (i, j) pairs to compare: six responses per prompt, from the
    good answer to a wrong one, short to long (a padded answer reaches ~300 tokens), and every two
    responses to the same prompt form a pair, as chosen/rejected pairs do in preference data."""
    texts, pairs = [], []
    for k, (prompt, good) in enumerate(_HELDOUT):
        responses = [good, _FILLER + good, good.split(",")[0] + ".", _POOR[k % len(_POOR)],
                     _POOR[(k + 2) % len(_POOR)] + " " + good, _FILLER * (1 + k % 4)]
        base = len(texts)
        texts += [(prompt, r) for r in responses]
        pairs += [(base + a, base + b) for a, b in itertools.combinations(range(len(responses)), 2)]
    return texts, pairs


def heldout_sequences(tokenizer_json: pathlib.Path, max_len: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()
    tok.no_truncation()
    texts, pairs = heldout_texts()
    return [tok.encode(p, r).ids[:max_len] for p, r in texts], pairs


def ranking_figures(ref, cand, pairs: list[tuple[int, int]]) -> dict:
    """cand against ref (fp32): Spearman, pairwise order agreement over `pairs`, max abs diff."""
    from scipy.stats import spearmanr

    r, c = np.asarray(ref, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    i, j = np.asarray(pairs).T
    agree = np.sign(r[i] - r[j]) == np.sign(c[i] - c[j])
    return {"spearman": float(spearmanr(r, c).statistic), "pairwise_order_agreement": float(agree.mean()),
            "max_abs_diff": float(np.abs(r - c).max()), "pairs": len(pairs), "sequences": len(r)}


# ---- int8 recipes -------------------------------------------------------------------------------
# Measured on the default model (docs/bench/precision-int8_2026-12-03.md): dynamic per-tensor int8 orders 18% of the
# held-out pairs differently from fp32; the recipes below are the variants that were tried.
INT8_RECIPES = ("dynamic", "dynamic-per-channel", "dynamic-per-channel-keep-ends", "static-per-channel",
                "weight-only-8bit")
#: No recipe passed the default gate on the default model; this one was the fastest of the closest.
DEFAULT_INT8_RECIPE = "dynamic-per-channel"


class _Reader:
    """Calibration inputs for static quantization: real tokenized pairs, each alone (batch 1,
    unpadded), the shapes and value ranges a server sees."""

    def __init__(self, seqs: list[list[int]]):
        self._it = iter(seqs)

    def get_next(self):
        s = next(self._it, None)
        if s is None:
            return None
        ids = np.asarray([s], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def rewind(self):  # the calibrator's protocol; one pass is all MinMax needs
        pass


def _ends(graph) -> list[str]:
    """Nodes of the first and last encoder layers and the head (pooler, classifier)."""
    names = [n.name for n in graph.node]
    layers = sorted({int(n.split("layer.")[1].split("/")[0]) for n in names if "layer." in n})
    if not layers:
        return []
    keep = (f"layer.{layers[0]}/", f"layer.{layers[-1]}/")
    return [n for n in names if any(k in n for k in keep) or "pooler" in n or "classifier" in n
            or n in (f"Attention_{layers[0]}", f"Attention_{layers[-1]}")]


def quantize_int8(fp32: pathlib.Path, out: pathlib.Path, recipe: str, calibration: list[list[int]]) -> None:
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    # Fused contrib ops (Attention, SkipLayerNormalization) defeat ONNX shape inference: FLOAT is
    # the type of every tensor it cannot type, else the quantizer skips those MatMuls.
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    if recipe.startswith("dynamic"):
        exclude = _ends(onnx.load(str(fp32)).graph) if recipe.endswith("keep-ends") else []
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, extra_options=extra,
                         per_channel=recipe != "dynamic", nodes_to_exclude=exclude)
        return
    if recipe == "weight-only-8bit":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        # int8 weights in blocks of 32, each with its own scale; accuracy level 4 lets the
        # kernel quantize activations per block too (int8 dot products), not per tensor.
        q = MatMulNBitsQuantizer(onnx.load(str(fp32)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
        q.process()
        q.model.save_model_to_file(str(out), False)
        return
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # Symbolic inference knows the contrib ops: static quantization then sees every activation.
    pre = out.with_suffix(".pre.onnx")
    model = SymbolicShapeInference.infer_shapes(onnx.load(str(fp32)), auto_merge=True)
    onnx.save(model, str(pre))
    try:
        quantize_static(str(pre), str(out), _Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul"], extra_options=extra)
    finally:
        pre.unlink(missing_ok=True)


# ---- adding a gated graph to a repository -----------------------------------------------------
#: Servers self-check int8 against the int8 graph's own golden scores: quantization error is the
#: model's, not the runtime's, so only runtime drift is held to this.
INT8_SELF_CHECK_TOLERANCE = 1e-3


@functools.lru_cache(maxsize=4)
def _reference(fp32: str, _mtime_ns: int, held: tuple, pad: int) -> np.ndarray:
    """fp32 held-out scores, kept while the graph file is unchanged: gating several candidates
    against one repository scores fp32 once."""
    return scores_alone(ort_session(pathlib.Path(fp32)), [list(s) for s in held], pad)


def gate_graph(repo: pathlib.Path, manifest: dict, graph: pathlib.Path, what: str, gate: Gate) -> dict:
    """The held-out figures of `graph` against the repository's fp32 graph; GateError below the gate."""
    held, pairs = heldout_sequences(repo / manifest["tokenizer"]["file"], int(manifest["max_sequence_length"]))
    pad = int(manifest["pad_token_id"])
    fp32 = repo / manifest["graphs"]["fp32"]
    ref = _reference(str(fp32), fp32.stat().st_mtime_ns, tuple(map(tuple, held)), pad)
    fig = {**ranking_figures(ref, scores_alone(ort_session(graph), held, pad), pairs), "gate": gate.as_dict()}
    print(f"      {what}: {describe(fig)}", flush=True)
    gate.check(f"{what} against fp32 on the held-out pairs:", fig)
    return fig


def add_int8(repo: pathlib.Path, recipe: str, gate: Gate) -> dict:
    """Quantizes the repository's fp32 graph with `recipe`, gates it, and records it in the manifest
    (graph, the int8 graph's own golden scores, figures). Below the gate nothing is written."""
    from tokenizers import Tokenizer

    from rmscore.model import default_model

    mf = repo / "manifest.json"
    manifest = json.loads(mf.read_text())
    tok = Tokenizer.from_file(str(repo / manifest["tokenizer"]["file"]))
    n = int(manifest["max_sequence_length"])
    calibration = [tok.encode(p, r).ids[:n] for p, r in default_model.calibration_pairs()]
    out, tmp = repo / "model.int8.onnx", repo / ".model.int8.partial.onnx"
    try:
        quantize_int8(repo / manifest["graphs"]["fp32"], tmp, recipe, calibration)
        fig = gate_graph(repo, manifest, tmp, f"int8 ({recipe})", gate)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.rename(out)
    seqs = [g["input_ids"] for g in manifest["golden"]]
    golden = [g["score"] for g in manifest["golden"]]
    q = parity(ort_session(out), seqs, golden, int(manifest["pad_token_id"]))
    for g, s in zip(manifest["golden"], q.pop("alone")):
        g["score_int8"] = s
    manifest["graphs"]["int8"] = out.name
    manifest["parity"]["int8"] = {**q, "ranking": fig, "recipe": recipe,
                                  "self_check_tolerance": INT8_SELF_CHECK_TOLERANCE}
    mf.write_text(json.dumps(manifest, indent=1) + "\n")
    return fig
