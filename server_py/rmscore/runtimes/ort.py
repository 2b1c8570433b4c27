"""ONNX Runtime backend: the same model.onnx and session options as the C++ server."""

from __future__ import annotations

import numpy as np

from rmscore.core.config import ServeConfig
from rmscore.model.repository import ModelRepo
from rmscore.core.runtime import progress

#: The warm-up's batches: the first real ones find the kernels and the arena ready. C++ main.cc WarmUp.
WARMUP_SHAPES = ((1, 8), (8, 64))

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


#: The run option that makes a run give the CPU arena's free memory back when it ends.
SHRINK_ARENA = ("memory.enable_memory_arena_shrinkage", "cpu:0")


class OrtBackend:
    """ONNX Runtime's CPU arena keeps the largest batch's activations for reuse (without it a 32 x 256
    batch took 1.26x as long: docs/cpp_bench.md), so one burst of long batches left the server 12%
    larger for good (docs/bench/attacks_2026-12-06.md, score_1024_pairs). Shrinking after every run
    costs about 4% a batch there; `release_memory`, which the batcher calls when it goes idle, shrinks
    once if any batch ran since the last time. Not only after batches larger than the warm-up's (in
    padded tokens): one 512-token sequence is no more tokens than the warm-up's 8 x 64 but needs more
    (attention grows with the square of the length), and cpp-grpc kept +11 MiB after them for good
    (docs/bench/attacks_2026-12-06.md). model_runner.cc does the same."""

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
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry(*SHRINK_ARENA)
        self._grown = False  # a batch ran since the last shrink; a plain flag: a lost update costs one
        # shrink run, or one skipped
        if cfg.device == "cuda":
            # The package lists CUDA when built with it, yet a session whose CUDA provider fails
            # to load falls back to the CPU with only a warning: refuse that, at start and per run.
            if self._sess.get_providers()[0] != "CUDAExecutionProvider":
                raise RuntimeError("--device cuda: the CUDA execution provider failed to load "
                                   f"(session providers: {self._sess.get_providers()}). "
                                   "Not falling back to the CPU.")
            self._sess.disable_fallback()

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        self._grown = True
        return self._sess.run(["scores"], {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    def warmup(self, max_batch_size: int, max_sequence_length: int) -> None:
        progress("warming up ONNX Runtime")
        for b, n in WARMUP_SHAPES:
            b = min(b, max_batch_size)
            self.score(np.ones((b, n), np.int64), np.ones((b, n), np.int64))

    def release_memory(self) -> bool:
        """Gives back the arena memory the batches since the last call grew (one 1 x 8 run, about 2 ms
        here); nothing when none ran since. True when it shrank."""
        if not self._grown:
            return False
        self._grown = False
        ids = np.ones((1, 8), np.int64)
        self._sess.run(["scores"], {"input_ids": ids, "attention_mask": ids}, self._shrink)
        return True

    def recompiles(self) -> int:
        return 0
