"""Model runtimes behind one interface: score(input_ids, attention_mask) -> float32 [batch].

Each backend loads from the model repository, warms up with progress output,
and self-checks against the manifest's golden scores before the server may
report SERVING. The interface (`Backend`) is the core's (core/runtime.py): the
runtimes implement it, and the core never imports them.
"""

from __future__ import annotations

import numpy as np

from rmscore.core.config import ServeConfig
from rmscore.core.runtime import Backend
from rmscore.model.repository import ModelRepo
from rmscore.model.padding import pad_batch

# Self-check tolerances against the golden eager-fp32 scores.
TOLERANCE = {"eager": 1e-5, "onnxruntime": 1e-5,
             # Inductor reorders float reductions; 1e-4 is ~1e-4 reward std on the calibrated head.
             "compile": 1e-4}
# Reduced-precision autocast against fp32 eager, in reward units (the default head has std 1).
# Measured on the default model on CPU: bf16 1.5e-2, fp16 2.1e-3.
AUTOCAST_TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2}


class SelfCheckError(RuntimeError):
    pass


def create(cfg: ServeConfig, repo: ModelRepo) -> Backend:
    if cfg.backend == "onnxruntime":
        from rmscore.runtimes.ort import OrtBackend
        return OrtBackend(cfg, repo)
    from rmscore.runtimes.torch_backend import TorchBackend
    return TorchBackend(cfg, repo)


#: Rows of the self-check's padded batch (padded_rows); server_cpp's kSelfCheckPaddedRows.
SELF_CHECK_PADDED_ROWS = 8


def padded_rows(seqs: list) -> list[int]:
    """The golden inputs the self-check scores as one padded batch, by index: the longest, then the
    shortest up to SELF_CHECK_PADDED_ROWS in all (ties by index). Most rows are then nearly all padding,
    which is what a mask or pooling bug changes and what moves a dynamic int8 graph's scores, without
    paying for every input padded to the longest: all 22 of the default model's at 512 tokens took 5 s of
    every start. As server_cpp's SelfCheckPaddedRows."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    if len(order) <= SELF_CHECK_PADDED_ROWS:
        return order
    return [order[-1], *order[:SELF_CHECK_PADDED_ROWS - 1]]


def self_check(backend: Backend, repo: ModelRepo, precision: str) -> float:
    """Golden inputs each alone, and padded_rows of them as one padded batch; raises past the tolerance."""
    seqs, golden = repo.golden()
    tol = AUTOCAST_TOLERANCE.get(precision, TOLERANCE[backend.name])
    if precision == "int8":
        golden = [g["score_int8"] for g in repo.manifest["golden"]]
        tol = repo.manifest["parity"]["int8"]["self_check_tolerance"]
    ref = np.asarray(golden, dtype=np.float64)
    alone = np.array([backend.score(*pad_batch([s], repo.pad_token_id))[0] for s in seqs], dtype=np.float64)
    rows = padded_rows(seqs)
    batched = np.asarray(backend.score(*pad_batch([seqs[i] for i in rows], repo.pad_token_id)), dtype=np.float64)
    diff = float(max(np.abs(alone - ref).max(), np.abs(batched - ref[rows]).max()))
    if not diff <= tol:
        raise SelfCheckError(f"self-check: {backend.name} {precision} scores differ from the golden scores by "
                             f"{diff:.3e}, over the tolerance {tol:.0e}; refusing to serve")
    return diff
