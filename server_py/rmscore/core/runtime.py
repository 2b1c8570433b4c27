"""What the core runs, as the core sees it: the interface a model runtime implements, the workers
it hands over, and how they are loaded and checked.

The core imports no runtime. Whoever starts a server (the front ends' runners) hands `ScoringCore` a
`Runtime`: `runtimes/workers.py` `RUNTIME`, whose `start_workers` makes the --model-workers sessions
on the core's loading thread and whose `self_check` holds one of them to the golden scores before
SERVING. runtimes/ implements `Backend` and returns `Workers`; both import this module, never the
other way round (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol

import numpy as np

from rmscore.core.config import ServeConfig
from rmscore.model.repository import ModelRepo


class Backend(Protocol):
    name: str

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...

    def warmup(self, max_batch_size: int, max_sequence_length: int) -> None: ...

    def recompiles(self) -> int: ...


@dataclasses.dataclass
class Workers:
    """What a server scores with. `runs`: one session per batcher thread (the same one may be listed
    more than once: shared); `lone`: the session for a batch that starts while no other runs and no
    other waits, with every intra-op thread; None when the runs' sessions have them already."""

    runs: list[Backend]
    lone: Backend | None = None

    def sessions(self) -> list[Backend]:
        """Each distinct session once, `runs` first: what is warmed up."""
        out: list[Backend] = []
        for b in [*self.runs, *([self.lone] if self.lone is not None else [])]:
            if all(b is not o for o in out):
                out.append(b)
        return out


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How the core gets what it runs. `start_workers(cfg, repo, fixed)`: the sessions to serve with
    (`fixed`: the --model-workers count, ELASTIC_WORKERS, or None to measure); `self_check(backend,
    repo, precision)`: the largest difference from the golden scores, raising past the tolerance."""

    start_workers: Callable[[ServeConfig, ModelRepo, int | None], Workers]
    self_check: Callable[[Backend, ModelRepo, str], float]


def progress(msg: str) -> None:
    """A start-up line on stdout, with the time: what the loading, the warm-up and the checks say."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
