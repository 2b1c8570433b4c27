"""ONNX Runtime's arena is given back once the batcher goes idle after any batch, not after every batch (runtimes/ort.py:
a burst of long batches left py-http 12% larger for good; shrinking after every run costs ~4%)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from rmscore.core.config import ServeConfig
from rmscore.model.repository import load_repo
from rmscore.runtimes.ort import OrtBackend

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend():
    repo = load_repo(ROOT / "models" / "default")
    b = OrtBackend(ServeConfig(model=repo.path, intra_op_threads=1), repo)
    b.warmup(8, repo.max_sequence_length)
    return b


def _score(backend, b: int, n: int) -> np.ndarray:
    ids = np.full((b, n), 1000, np.int64)
    return backend.score(ids, np.ones((b, n), np.int64))


def test_the_arena_is_given_back_once_after_any_batch(backend):
    backend.release_memory()
    assert backend.release_memory() is False  # nothing ran since
    # One 512-token sequence: no more padded tokens than the warm-up's 8 x 64, yet its attention needs
    # more, and it was kept for good when only larger token counts counted (runtimes/ort.py).
    _score(backend, 1, 512)
    assert backend.release_memory() is True
    before = _score(backend, 4, 256)
    assert backend.release_memory() is True
    assert backend.release_memory() is False  # once, until a batch runs again
    # The session scores as before after giving its arena back.
    np.testing.assert_array_equal(_score(backend, 4, 256), before)
