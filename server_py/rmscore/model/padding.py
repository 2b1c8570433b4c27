"""Padding token-id sequences into a batch: numpy only, so the ONNX Runtime servers, whose batcher
and self-check pad every batch, never import torch (model/modeling.py does)."""

from __future__ import annotations

import numpy as np


def pad_batch(seqs: list[list[int]], pad_id: int, left: bool = False):
    """Pad to the longest; returns int64 numpy (input_ids, attention_mask)."""
    longest = max(len(s) for s in seqs)
    ids = np.full((len(seqs), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    for i, s in enumerate(seqs):
        if left:
            ids[i, longest - len(s):] = s
            mask[i, longest - len(s):] = 1
        else:
            ids[i, :len(s)] = s
            mask[i, :len(s)] = 1
    return ids, mask
