"""PyTorch backends: eager (`torch.inference_mode`) and `torch.compile` (inductor, freezing)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from rmscore.core.config import ServeConfig
from rmscore.core.runtime import progress
from rmscore.model.repository import ModelRepo
from rmscore.model.modeling import RewardModule, inspect_checkpoint, load_hf_model

_threads_set = False


def _set_threads(intra: int, inter: int) -> None:
    # torch allows setting inter-op threads once per process, before any parallel work.
    global _threads_set
    torch.set_num_threads(intra)
    if not _threads_set:
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError:
            pass
        _threads_set = True


class TorchBackend:
    def __init__(self, cfg: ServeConfig, repo: ModelRepo):
        self.name = cfg.backend
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda: PyTorch sees no CUDA device "
                               f"(torch {torch.__version__}, cuda build: {torch.version.cuda}); "
                               "not falling back to the CPU")
        self.device = torch.device(cfg.device)
        self._autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self._intra_op_threads = cfg.intra_op_threads
        _set_threads(cfg.intra_op_threads, cfg.inter_op_threads)
        progress(f"loading {repo.hf_dir} into PyTorch {torch.__version__} ({self.name}, {cfg.device})")
        spec = inspect_checkpoint(repo.hf_dir)
        # SDPA for serving: same math as the eager attention the graph was traced from.
        module = RewardModule(load_hf_model(repo.hf_dir, attn_implementation="sdpa"), spec).eval().to(self.device)
        self._fn = module
        self._graphs_after_warmup = 0
        if self.name == "compile":
            import torch._inductor.config as inductor_config

            # Freezing folds weights into the graph: 1.6x over eager here (docs/machine.md);
            # plain torch.compile was slower than eager on this CPU.
            inductor_config.freezing = True
            # Without this, equal sizes share one symbol (batch 2 x length 2 at warm-up)
            # and the first batch whose sizes differ recompiles.
            torch.fx.experimental._config.use_duck_shape = False
            self._fn = torch.compile(module, dynamic=True)

    @torch.inference_mode()
    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        n = input_ids.shape[0]
        if self.name == "compile":
            input_ids, attention_mask = _at_least_two(input_ids, attention_mask)
        ids = torch.from_numpy(input_ids).to(self.device)
        mask = torch.from_numpy(attention_mask).to(self.device)
        with torch.autocast(self.device.type, dtype=self._autocast or torch.float32, enabled=bool(self._autocast)):
            return self._fn(ids, mask).float().cpu().numpy()[:n]

    def warmup(self, max_batch_size: int, max_sequence_length: int) -> None:
        # compile: score() never shows the graph a size-1 dimension, so one dynamic graph
        # serves every shape and these warm-up calls compile it once; serving never recompiles.
        shapes = [(1, 1), (2, 16), (min(max_batch_size, 8), min(max_sequence_length, 128))]
        for i, (b, n) in enumerate(shapes, 1):
            t = time.perf_counter()
            self.score(np.ones((b, n), np.int64), np.ones((b, n), np.int64))
            progress(f"warm-up {i}/{len(shapes)}: batch {b} x length {n} in {time.perf_counter() - t:.1f} s")
        self._graphs_after_warmup = self._unique_graphs()

    def use_threads(self) -> None:
        """Set this worker's intra-op thread count on the calling thread: --model-workers auto sets it
        per candidate."""
        torch.set_num_threads(self._intra_op_threads)

    def on_threads(self, threads: int) -> "ThreadsRun":
        """This model, run with `threads` intra-op threads by whichever thread calls it (elastic)."""
        return ThreadsRun(self, threads)

    def recompiles(self) -> int:
        return max(0, self._unique_graphs() - self._graphs_after_warmup) if self.name == "compile" else 0

    @staticmethod
    def _unique_graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])


class ThreadsRun:
    """A TorchBackend run at a set intra-op thread count, one model shared. Under OpenMP torch's count
    is the calling thread's own (at::set_num_threads sets the caller's OpenMP and MKL counts; another
    thread's call does not change it: a 1024 x 1024 matmul on a thread set to 1 kept its 1-thread time
    after the main thread set 2), so two batcher threads may each run a batch on one thread while a
    lone batch runs on every thread (runtimes/workers.py, elastic). Setting it costs about 0.2 us.

    A run on more than one thread goes to one thread of its own. libgomp keeps a team of OpenMP
    threads per calling thread, and the batcher hands lone batches to whichever of its threads is
    idle: a run woke one team while the last run's team still spun, and 2-thread batch-1 runs handed
    round-robin between two threads went from 58 to 35 a second (in process, this machine). The
    hand-off to the one thread costs tens of microseconds against a run's milliseconds."""

    def __init__(self, backend: TorchBackend, threads: int):
        self.backend, self.threads = backend, threads
        self.name = backend.name
        self._own = ThreadPoolExecutor(1, thread_name_prefix=f"torch-{threads}t") if threads > 1 else None

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if self._own is None:
            return self._score(input_ids, attention_mask)
        return self._own.submit(self._score, input_ids, attention_mask).result()

    def _score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        torch.set_num_threads(self.threads)
        return self.backend.score(input_ids, attention_mask)

    def warmup(self, max_batch_size: int, max_sequence_length: int) -> None:
        def run() -> None:
            torch.set_num_threads(self.threads)
            self.backend.warmup(max_batch_size, max_sequence_length)

        if self._own is None:
            run()
        else:
            self._own.submit(run).result()

    def recompiles(self) -> int:
        return self.backend.recompiles()


def _at_least_two(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic shapes specialise on size 1, which would cost a compile per corner (~30 s each
    here). A lone sequence is duplicated and a length-1 batch gets one masked pad column:
    neither changes a score (pooling reads the mask), and the caller keeps the first rows."""
    if ids.shape[1] == 1:
        ids = np.pad(ids, ((0, 0), (0, 1)))
        mask = np.pad(mask, ((0, 0), (0, 1)))
    if ids.shape[0] == 1:
        ids, mask = np.repeat(ids, 2, axis=0), np.repeat(mask, 2, axis=0)
    return ids, mask
