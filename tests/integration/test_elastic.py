"""--model-workers elastic, the default, where it splits threads: ONNX Runtime and eager PyTorch on a
CPU with two intra-op threads (the other tests run one, where elastic keeps one session). Both ways it
runs, the lone batch's (every thread) and the shared one (a thread per batch), score the golden inputs
to their golden scores, one request at a time (lone) and many at once (shared, beside a lone one).
Which a batch takes is the batcher's unit tests' (test_batcher.py, test_batcher.cc)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import servers
from harness import GOLDEN_IDS, GOLDEN_SCORES
from rmscore_tools.caller import Caller

KINDS = [k for k in ("py-grpc-onnxruntime", "cpp-grpc", "py-grpc-eager") if k in servers.available_kinds()]
SAYS = {"py-grpc-eager": "elastic, up to 2 batches at once on one model at 1 thread each, a batch alone on 2 threads"}
SESSIONS = "elastic, up to 2 batches at once on one 1-thread session, a batch alone on a 2-thread one"
TOLERANCE = 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_elastic_scores_golden_alone_and_concurrently(kind):
    server = servers.start(kind, intra_op_threads=2)
    try:
        assert SAYS.get(kind, SESSIONS) in server.log()
        caller = Caller.to(server)
        alone = np.array([caller.score_ids([ids]).scores[0] for ids in GOLDEN_IDS])
        assert np.abs(alone - GOLDEN_SCORES).max() <= TOLERANCE

        def one(i: int) -> float:
            return Caller.to(server).score_ids([GOLDEN_IDS[i % len(GOLDEN_IDS)]]).scores[0]

        n = 16 * len(GOLDEN_IDS)
        with ThreadPoolExecutor(16) as pool:
            together = np.array(list(pool.map(one, range(n))))
        assert np.abs(together - np.resize(GOLDEN_SCORES, n)).max() <= TOLERANCE
    finally:
        server.stop()
