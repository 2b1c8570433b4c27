"""ONNX Runtime backend: the same model.onnx and session options as the C++ server."""

from __future__ import annotations

import numpy as np

from rmscore.core.config import ServeConfig
from rmscore.model.repository import ModelRepo
from rmscore.core.runtime import progress

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OrtBackend:
    name = "onnxruntime"

    def __init__(self, cfg: ServeConfig, repo: ModelRepo):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = cfg.intra_op_threads
        so.inter_op_num_threads = cfg.inter_op_threads
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[cfg.graph_optimization_level])
        providers = ["CPUExecutionProvider"]
        if cfg.device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError("--device cuda: this onnxruntime has no CUDAExecutionProvider "
                                   f"(available: {ort.get_available_providers()}); install onnxruntime-gpu "
                                   "(scripts/setup.sh with RMSCORE_GPU=1). Not falling back to the CPU.")
            providers = ["CUDAExecutionProvider"]
        path = repo.graph_path(cfg.precision)
        progress(f"loading {path} into ONNX Runtime {ort.__version__} ({providers[0]})")
        self._sess = ort.InferenceSession(str(path), so, providers=providers)
        if cfg.device == "cuda":
            # The package lists CUDA when built with it, yet a session whose CUDA provider fails
            # to load falls back to the CPU with only a warning: refuse that, at start and per run.
            if self._sess.get_providers()[0] != "CUDAExecutionProvider":
                raise RuntimeError("--device cuda: the CUDA execution provider failed to load "
                                   f"(session providers: {self._sess.get_providers()}). "
                                   "Not falling back to the CPU.")
            self._sess.disable_fallback()

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self._sess.run(["scores"], {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    def warmup(self, max_batch_size: int, max_sequence_length: int) -> None:
        progress("warming up ONNX Runtime")
        for b, n in ((1, 8), (min(8, max_batch_size), 64)):
            self.score(np.ones((b, n), np.int64), np.ones((b, n), np.int64))

    def recompiles(self) -> int:
        return 0
