"""The start-up self-check (server_py/rmscore/runtimes/__init__.py; server_cpp's SelfCheckPaddedRows picks
the same rows): every golden input alone, and the longest with the seven shortest as one padded batch.
Run on the default model's graph through ONNX Runtime, and on the same graph with a padding fault."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest

from rmscore.model.repository import load_repo
from rmscore.runtimes import SELF_CHECK_PADDED_ROWS, SelfCheckError, padded_rows, self_check

ROOT = pathlib.Path(__file__).resolve().parents[2]


class OrtGraph:
    """The default model's graph in a plain ONNX Runtime session; `pad_bias` adds that much per padding
    token to a row's score, as a mask or pooling bug would."""

    name = "onnxruntime"

    def __init__(self, path: pathlib.Path, pad_bias: float = 0.0):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self._sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._pad_bias = pad_bias

    def score(self, input_ids, attention_mask):
        out = self._sess.run(["scores"], {"input_ids": input_ids, "attention_mask": attention_mask})[0]
        return out + self._pad_bias * (attention_mask == 0).sum(axis=1)


@pytest.fixture(scope="module")
def repo():
    return load_repo(ROOT / "models/default")


def test_padded_rows_are_the_longest_then_the_shortest():
    seqs = [[1] * n for n in (35, 19, 48, 50, 24, 22, 27, 23, 38, 22, 49, 51, 21, 1, 2, 3, 17, 64, 128, 255, 511, 512)]
    rows = padded_rows(seqs)
    assert len(rows) == SELF_CHECK_PADDED_ROWS == 8
    assert rows[0] == 21  # 512 tokens
    assert [len(seqs[i]) for i in rows[1:]] == [1, 2, 3, 17, 19, 21, 22]
    assert rows == [21, 13, 14, 15, 16, 1, 12, 5]  # of the two 22-token inputs, the first (ties by index)
    assert padded_rows(seqs[:5]) == sorted(range(5), key=lambda i: len(seqs[i]))  # few: all of them


def test_the_default_model_passes(repo):
    assert self_check(OrtGraph(repo.path / "model.onnx"), repo, "fp32") <= 1e-5


def test_a_padding_fault_fails_it(repo):
    # Alone, no row has padding: only the padded batch can see this fault.
    with pytest.raises(SelfCheckError, match="refusing to serve"):
        self_check(OrtGraph(repo.path / "model.onnx", pad_bias=1e-6), repo, "fp32")
