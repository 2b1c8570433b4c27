"""The start-up self-check (server_py/rmscore/runtimes/__init__.py; server_cpp's SelfCheckPaddedRows picks
the same rows): every golden input alone, and the longest with the seven shortest as one padded batch.
Run on the default model through the serving ONNX Runtime backend, and through it with a padding fault."""

from __future__ import annotations

import pathlib

import pytest

from rmscore.core.config import ServeConfig
from rmscore.model.repository import load_repo
from rmscore.runtimes import SELF_CHECK_PADDED_ROWS, SelfCheckError, padded_rows, self_check
from rmscore.runtimes.ort import OrtBackend

ROOT = pathlib.Path(__file__).resolve().parents[2]


class PaddingFault:
    """The serving backend with a padding fault: `pad_bias` added to a row's score per padding token, as
    a mask or pooling bug would."""

    def __init__(self, backend: OrtBackend, pad_bias: float):
        self.name, self._backend, self._pad_bias = backend.name, backend, pad_bias

    def score(self, input_ids, attention_mask):
        return self._backend.score(input_ids, attention_mask) + self._pad_bias * (attention_mask == 0).sum(axis=1)


@pytest.fixture(scope="module")
def repo():
    return load_repo(ROOT / "models/default")


@pytest.fixture(scope="module")
def backend(repo):
    return OrtBackend(ServeConfig(model=repo.path, intra_op_threads=1), repo)


def test_padded_rows_are_the_longest_then_the_shortest():
    seqs = [[1] * n for n in (35, 19, 48, 50, 24, 22, 27, 23, 38, 22, 49, 51, 21, 1, 2, 3, 17, 64, 128, 255, 511, 512)]
    rows = padded_rows(seqs)
    assert len(rows) == SELF_CHECK_PADDED_ROWS == 8
    assert [len(seqs[i]) for i in rows] == [512, 1, 2, 3, 17, 19, 21, 22]
    assert rows == [21, 13, 14, 15, 16, 1, 12, 5]  # of the two 22-token inputs, the first (ties by index)
    assert padded_rows(seqs[:5]) == sorted(range(5), key=lambda i: len(seqs[i]))  # few: all of them


def test_the_default_model_passes(backend, repo):
    assert self_check(backend, repo, "fp32") <= 1e-5


def test_a_padding_fault_fails_it(backend, repo):
    # Alone, no row has padding: only the padded batch can see this fault.
    with pytest.raises(SelfCheckError, match="refusing to serve"):
        self_check(PaddingFault(backend, pad_bias=1e-6), repo, "fp32")
