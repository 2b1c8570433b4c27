"""The ranking gate on real ONNX Runtime graphs, and the start-time precision checks."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from rmscore.core import config
from rmscore.model import precision

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "models" / "default"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> pathlib.Path:
    r = tmp_path_factory.mktemp("gate")
    for f in ("manifest.json", "model.onnx", "tokenizer.json"):
        shutil.copy(DEFAULT / f, r / f)
    return r


def _perturbed(repo: pathlib.Path, name: str, rel_noise: float) -> pathlib.Path:
    """model.onnx with noise on every encoder FFN weight, `rel_noise` times each weight's std."""
    m = onnx.load(str(repo / "model.onnx"))
    rng = np.random.default_rng(0)
    ffn = {n.input[1] for n in m.graph.node if n.op_type == "MatMul" and "intermediate/dense" in n.name}
    assert len(ffn) == 6, ffn
    for init in m.graph.initializer:
        if init.name in ffn:
            w = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(w + rng.normal(0, rel_noise * w.std(), w.shape).astype(w.dtype),
                                                  init.name))
    out = repo / name
    onnx.save(m, str(out))
    return out


def test_gate_refuses_a_damaged_graph_quoting_the_figures(repo):
    manifest = json.loads((repo / "manifest.json").read_text())
    damaged = _perturbed(repo, "damaged.onnx", 0.5)
    with pytest.raises(precision.GateError) as e:
        precision.gate_graph(repo, manifest, damaged, "damaged", precision.Gate())
    msg = str(e.value)
    assert "Spearman 0." in msg and "pairwise agreement 0." in msg and "max abs diff" in msg
    assert "Spearman >= 0.995 and pairwise agreement >= 0.99" in msg


def test_gate_accepts_a_good_graph_and_reports_its_figures(repo):
    manifest = json.loads((repo / "manifest.json").read_text())
    good = _perturbed(repo, "good.onnx", 1e-4)  # far below any quantization error
    fig = precision.gate_graph(repo, manifest, good, "good", precision.Gate())
    assert fig["spearman"] >= 0.9999 and fig["pairwise_order_agreement"] == 1.0
    assert 0 < fig["max_abs_diff"] < 1e-2
    assert fig["pairs"] == 180 and fig["sequences"] == 72


def test_gate_thresholds_are_configurable_and_validated():
    fig = {"spearman": 0.97, "pairwise_order_agreement": 0.82, "max_abs_diff": 0.7, "pairs": 180}
    precision.Gate(0.95, 0.8).check("int8", fig)
    with pytest.raises(precision.GateError, match="Spearman 0.9700, pairwise agreement 0.8200"):
        precision.Gate().check("int8", fig)
    with pytest.raises(ValueError, match="--gate-pairwise: must be a number in \\[-1, 1\\], got 1.5"):
        precision.Gate(0.9, 1.5)


def test_heldout_set_is_not_the_calibration_set():
    from rmscore.model import default_model

    texts, pairs = precision.heldout_texts()
    assert not set(texts) & set(default_model.calibration_pairs())
    assert not {p for p, _ in texts} & {p for p, _ in default_model.calibration_pairs()}
    assert all(texts[i][0] == texts[j][0] for i, j in pairs)  # pairs compare answers to one prompt


@pytest.mark.parametrize("flags, ok", [("fpu sse avx2", False), ("fpu avx512f avx512_bf16", True),
                                       ("fpu amx_bf16 amx_tile", True)])
def test_bf16_on_cpu_needs_the_instructions(tmp_path, monkeypatch, flags, ok):
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(config, "CPUINFO", tmp_path / "cpuinfo")
    problem = config.precision_problem("bf16", "eager", "cpu")
    assert (problem is None) == ok, problem
    if not ok:
        assert "avx512_bf16 or amx_bf16" in problem and "slower than fp32" in problem
        with pytest.raises(config.ConfigError, match="--precision: bf16 on --device cpu needs .* got 'bf16'"):
            config.ServeConfig(model=DEFAULT, backend="eager", precision="bf16")


def test_unknown_and_misplaced_precisions_are_refused():
    assert "must be one of" in config.precision_problem("int4", "onnxruntime", "cpu")
    assert "--device cuda" in config.precision_problem("fp16", "onnxruntime", "cpu")
    assert config.precision_problem("fp16", "onnxruntime", "cuda") is None
    assert config.precision_problem("bf16", "eager", "cuda") is None
