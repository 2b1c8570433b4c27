"""Scoring a graph with ONNX Runtime outside a server: what the export's parity gate and the
reduced-precision ranking gate (precision.py) both measure with. numpy only at import; onnxruntime
is imported when a session is made."""

from __future__ import annotations

import pathlib

import numpy as np

from rmscore.model.padding import pad_batch


def ort_session(path: pathlib.Path, threads: int = 2):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_scores(sess, seqs: list[list[int]], pad_id: int) -> np.ndarray:
    ids, mask = pad_batch(seqs, pad_id)
    return sess.run(["scores"], {"input_ids": ids, "attention_mask": mask})[0]


def scores_alone(sess, seqs: list[list[int]], pad_id: int) -> np.ndarray:
    """Each sequence scored alone (batch 1, unpadded), as float64."""
    return np.array([ort_scores(sess, [s], pad_id)[0] for s in seqs], dtype=np.float64)


def parity(sess, seqs, golden, pad_id) -> dict:
    """Max abs diff of a graph against eager, each sequence alone and all as one padded batch."""
    g = np.asarray(golden, dtype=np.float64)
    alone = scores_alone(sess, seqs, pad_id)
    batched = ort_scores(sess, seqs, pad_id).astype(np.float64)
    return {"max_abs_diff": float(max(np.abs(alone - g).max(), np.abs(batched - g).max())),
            "max_abs_diff_alone": float(np.abs(alone - g).max()),
            "max_abs_diff_padded_batch": float(np.abs(batched - g).max()),
            "sequences": len(seqs), "alone": alone.tolist()}
