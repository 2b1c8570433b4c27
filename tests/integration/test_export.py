"""`rmscore export`: parity of ONNX Runtime with PyTorch eager, padding invariance, decoders, bad input."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch

from rmscore.model.repository import REQUIRED_KEYS, load_repo
from rmscore.model.modeling import RewardModule, inspect_checkpoint, load_hf_model
from rmscore.model.padding import pad_batch

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "models" / "default"
MINILM_TOKENIZER = DEFAULT / "tokenizer.json"


def run_export(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "rmscore.cli", "export", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900)


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_batch(sess, seqs, pad, left=False):
    ids, mask = pad_batch(seqs, pad, left=left)
    return sess.run(["scores"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float64)


def eager_alone(module, seqs):
    with torch.inference_mode():
        return np.array([float(module(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.int64))[0])
                         for s in seqs])


def random_seqs(n, vocab, max_len, seed):
    rng = random.Random(seed)
    lengths = [1, max_len] + [rng.randint(1, max_len) for _ in range(n - 2)] if n > 1 else [max_len]
    return [[rng.randrange(vocab) for _ in range(k)] for k in lengths[:n]]


# ---- the default encoder ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_repo():
    return load_repo(DEFAULT)


@pytest.fixture(scope="module")
def default_module(default_repo):
    return RewardModule(load_hf_model(default_repo.hf_dir), inspect_checkpoint(default_repo.hf_dir)).eval()


def test_manifest_is_complete(default_repo):
    m = default_repo.manifest
    assert set(REQUIRED_KEYS) <= set(m)
    assert m["architecture"] == "BertForSequenceClassification" and m["family"] == "encoder"
    assert m["pooling"] == "first" and m["max_sequence_length"] == 512 and m["vocab_size"] == 30522
    assert m["onnxruntime_version"] == ort.__version__
    assert m["parity"]["fp32"]["max_abs_diff"] <= m["parity"]["fp32"]["tolerance"] == 1e-5
    lengths = {len(g["input_ids"]) for g in m["golden"]}
    assert min(lengths) == 1 and max(lengths) == 512 and len(lengths) >= 10
    assert m["version"].startswith("sha256:") and (DEFAULT / m["graphs"]["fp32"]).is_file()


def test_default_head_is_calibrated_to_unit_spread(default_repo):
    """The documented property (rmscore/default_model.py): over the calibration pairs the exported
    graph's rewards have mean 0 and standard deviation 1, to float precision."""
    from tokenizers import Tokenizer

    from rmscore.model.default_model import calibration_pairs

    pairs = calibration_pairs()
    assert default_repo.manifest["head"]["calibration_pairs"] == len(pairs)
    tok = Tokenizer.from_file(str(default_repo.tokenizer_path))
    sess = session(default_repo.graph_path("fp32"))
    scores = np.array([ort_batch(sess, [tok.encode(p, r).ids], 0)[0] for p, r in pairs])
    assert abs(scores.mean()) <= 1e-4 and abs(scores.std(ddof=1) - 1) <= 1e-4, (scores.mean(), scores.std(ddof=1))
    golden = np.array([g["score"] for g in default_repo.manifest["golden"][:13]])  # every 5th pair
    assert 0.3 < golden.std() < 3, golden  # an untrained head would give ~0.01


def test_int8_accuracy_is_reported(default_repo):
    q = default_repo.manifest["parity"].get("int8")
    if q is None:
        pytest.skip("exported without --int8")
    r = q.get("ranking", q)  # manifests from before the ranking gate kept the figures at the top
    assert {"max_abs_diff", "spearman", "pairwise_order_agreement"} <= set(r)
    assert r["spearman"] > 0.5 and r["pairwise_order_agreement"] > 0.7


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_encoder_parity_across_batches_and_lengths(default_repo, default_module, batch):
    seqs = random_seqs(batch, 30522, 512 if batch < 64 else 160, seed=batch)
    got = ort_batch(session(default_repo.graph_path("fp32")), seqs, 0)
    want = eager_alone(default_module, seqs)
    assert np.abs(got - want).max() <= 1e-5


def test_padding_does_not_change_a_score(default_repo, default_module):
    sess = session(default_repo.graph_path("fp32"))
    short = [101, 2023, 2003, 1037, 3231, 102]
    alone = ort_batch(sess, [short], 0)[0]
    padded = ort_batch(sess, [short, [7] * 300], 0)[0]
    assert abs(alone - padded) <= 1e-5
    with torch.inference_mode():
        ids = torch.tensor([short + [0] * 20])
        mask = torch.tensor([[1] * 6 + [0] * 20])
        assert abs(float(default_module(ids, mask)[0]) - alone) <= 1e-5


def test_wrapper_scores_what_the_hf_model_scores(default_repo, default_module):
    ids = torch.tensor([[101, 2023, 2003, 102]])
    with torch.inference_mode():
        hf = default_module.model(input_ids=ids).logits[0, 0]
        assert abs(float(default_module(ids, torch.ones_like(ids))[0]) - float(hf)) <= 1e-6


# ---- decoders built from small configs -----------------------------------------------------

def make_decoder(path: pathlib.Path, family: str) -> pathlib.Path:
    from transformers import LlamaConfig, LlamaForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(1234)
    common = dict(vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  num_labels=1, pad_token_id=0)
    if family == "llama":
        model = LlamaForSequenceClassification(LlamaConfig(**common))
    else:
        model = Qwen2ForSequenceClassification(Qwen2Config(**common))
    model.save_pretrained(str(path))
    shutil.copy(MINILM_TOKENIZER, path / "tokenizer.json")
    return path


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def decoder_repo(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    src = make_decoder(tmp / "ckpt", request.param)
    r = run_export("--model", str(src), "--name", f"tiny-{request.param}", "--output", str(tmp / "models"))
    assert r.returncode == 0, r.stdout + r.stderr
    return load_repo(tmp / "models" / f"tiny-{request.param}"), src


def test_decoder_manifest_and_parity(decoder_repo):
    repo, src = decoder_repo
    m = repo.manifest
    assert m["family"] == "decoder" and m["pooling"] == "last" and m["max_sequence_length"] == 256
    module = RewardModule(load_hf_model(src), inspect_checkpoint(src)).eval()
    for batch in (1, 5, 32, 64):  # 64: a full client chunk, lengths 1..256 mixed in one padded batch
        seqs = random_seqs(batch, 30522, 256, seed=batch)
        got = ort_batch(session(repo.graph_path("fp32")), seqs, repo.pad_token_id)
        assert np.abs(got - eager_alone(module, seqs)).max() <= 1e-5


def test_decoder_left_and_right_padding_agree(decoder_repo):
    repo, src = decoder_repo
    sess = session(repo.graph_path("fp32"))
    seqs = random_seqs(6, 30522, 100, seed=11)
    seqs[2] = seqs[2][:-1] + [0]  # a real token equal to the pad id is still the last token
    right, left = ort_batch(sess, seqs, 0), ort_batch(sess, seqs, 0, left=True)
    assert np.abs(right - left).max() <= 1e-5
    module = RewardModule(load_hf_model(src), inspect_checkpoint(src)).eval()
    ids, mask = pad_batch(seqs, 0, left=True)
    with torch.inference_mode():
        eager_left = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert np.abs(eager_left - eager_alone(module, seqs)).max() <= 1e-5


def test_decoder_wrapper_matches_hf_on_unpadded_input(decoder_repo):
    _, src = decoder_repo
    hf = load_hf_model(src)
    module = RewardModule(hf, inspect_checkpoint(src)).eval()
    ids = torch.tensor([[5, 17, 2001, 4000, 12]])
    with torch.inference_mode():
        assert abs(float(module(ids, torch.ones_like(ids))[0]) - float(hf(input_ids=ids).logits[0, 0])) <= 1e-5


# ---- bad input: clear message, non-zero exit, nothing half-written ----------------------------

def _bad_checkpoint(tmp: pathlib.Path, kind: str) -> str:
    if kind == "missing":
        return str(tmp / "nope")
    src = tmp / kind
    shutil.copytree(DEFAULT / "hf", src)
    cfg = json.loads((src / "config.json").read_text())
    if kind == "not-seqcls":
        cfg["architectures"] = ["BertModel"]
    elif kind == "two-labels":
        cfg["id2label"] = {"0": "a", "1": "b"}
        cfg["label2id"] = {"a": 0, "b": 1}
        cfg.pop("num_labels", None)
    elif kind == "no-tokenizer":
        (src / "tokenizer.json").unlink()
    (src / "config.json").write_text(json.dumps(cfg))
    return str(src)


@pytest.mark.parametrize("kind,message", [
    ("missing", "is not a directory"),
    ("not-seqcls", "is not a ...ForSequenceClassification model"),
    ("two-labels", "num_labels is 2; a reward model has exactly 1 label"),
    ("no-tokenizer", "has no tokenizer.json"),
])
def test_bad_checkpoint_fails_clearly(tmp_path, kind, message):
    out = tmp_path / "models"
    r = run_export("--model", _bad_checkpoint(tmp_path, kind), "--name", "x", "--output", str(out))
    assert r.returncode != 0 and message in r.stdout + r.stderr, r.stdout + r.stderr
    assert not (out / "x").exists()
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def _broken_checkpoint(src: pathlib.Path, kind: str) -> pathlib.Path:
    """A copy of the default checkpoint broken in one way; every one fails before weights are used."""
    shutil.copytree(DEFAULT / "hf", src)
    cfg_path = src / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if kind == "config not JSON":
        cfg_path.write_text("{not json")
    elif kind == "config not an object":
        cfg_path.write_text("[1, 2]")
    elif kind == "config lacks vocab_size":
        cfg.pop("vocab_size")
        cfg_path.write_text(json.dumps(cfg))
    elif kind == "config bad vocab_size":
        cfg["vocab_size"] = "many"
        cfg_path.write_text(json.dumps(cfg))
    elif kind == "unknown architecture":
        cfg["architectures"] = ["FooForSequenceClassification"]
        cfg_path.write_text(json.dumps(cfg))
    elif kind == "architectures not a list of names":
        cfg["architectures"] = "BertForSequenceClassification"
        cfg_path.write_text(json.dumps(cfg))
    elif kind == "architecture of another model type":
        cfg["architectures"] = ["RobertaForSequenceClassification"]
        cfg_path.write_text(json.dumps(cfg))
    elif kind == "weights unreadable":  # transformers raises OSError for a weights path it cannot open
        (src / "model.safetensors").unlink()
        (src / "model.safetensors").mkdir()
    elif kind == "weights corrupt":
        (src / "model.safetensors").write_bytes(b"not safetensors")
    elif kind == "tokenizer corrupt":
        (src / "tokenizer.json").write_text("{bad")
    return src


BROKEN = {
    "config not JSON": "'{d}/config.json' is not valid JSON: Expecting property name",
    "config not an object": "'{d}/config.json' must hold a JSON object, got list",
    "config lacks vocab_size": "'{d}/config.json' has no 'vocab_size' key",
    "config bad vocab_size": "'{d}/config.json' holds a bad value: invalid literal for int() with base 10: 'many'",
    "unknown architecture": "architecture 'FooForSequenceClassification' in '{d}/config.json' is not a class in "
                            "transformers",
    "architectures not a list of names": "'architectures' in '{d}/config.json' must be a list of class names, "
                                         "got 'BertForSequenceClassification'",
    "architecture of another model type": "architecture 'RobertaForSequenceClassification' in '{d}/config.json' "
                                          "does not match the class its model_type loads, "
                                          "'BertForSequenceClassification'",
    "weights unreadable": "cannot load the checkpoint in '{d}': ",
    "weights corrupt": "cannot load the checkpoint in '{d}': ",
    "tokenizer corrupt": "'{d}/tokenizer.json' is not a Hugging Face tokenizer file: ",
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_checkpoint_exits_with_one_line_quoting_it(tmp_path, kind):
    src = _broken_checkpoint(tmp_path / "ckpt", kind)
    out = tmp_path / "models"
    r = run_export("--model", str(src), "--name", "x", "--output", str(out))
    text = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("rmscore export: error: ")]
    assert len(errors) == 1, text
    assert "rmscore export: error: --model: " + BROKEN[kind].format(d=src) in errors[0], text
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def test_unwritable_output_fails_clearly(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = run_export("--name", "x", "--output", str(blocker / "models"))
    assert r.returncode != 0 and "cannot write under" in r.stdout, r.stdout + r.stderr


def test_failed_parity_gate_leaves_nothing(tmp_path, monkeypatch):
    from rmscore.model import export as ex
    monkeypatch.setattr(ex, "FP32_TOLERANCE", 1e-12)  # the gate itself is under test, not the model
    with pytest.raises(ex.ExportError, match="parity gate: ONNX Runtime differs from PyTorch eager by"):
        ex.export(str(DEFAULT / "hf"), "gated", str(tmp_path))
    assert os.listdir(tmp_path) == []
