"""BentoML peer: the reward model (ONNX, onnxruntime) as a BentoML 1.4 service, one worker, with BentoML's
own adaptive batching (a `batchable=True` API).

Followed: BentoML "Adaptive batching" (docs.bentoml.com/en/latest/guides/adaptive-batching.html: a
`@bentoml.api(batchable=True, batch_dim=0, max_batch_size=..., max_latency_ms=...)` method that takes a batch
(a list) and returns one of the same length; clients send a batch of one and the server's dispatcher merges
requests along batch_dim) and "Services"/"Configurations" (`@bentoml.service(workers=..., resources=...,
traffic=...)`), bentoml==1.4.40. Serve it from this folder with the peers' venv:

    cd docs/bench/peers_2026-12-07 && /tmp/peers/venv/bin/bentoml serve serve_bento:Scorer --host 127.0.0.1 --port 8012

POST /score  {"ids": [[101, ..., 102]]}  ->  [float].  One sequence per request (a batch of one, the
batchable API's input type); the dispatcher concatenates the lists of concurrent requests.

Settings: max_batch_size 32 (rmscore's --max-batch-size default), max_latency_ms 60000 (BentoML's default:
the dispatcher sheds with 503 only when a request's predicted latency passes it, and a closed loop at 64 on
2 cores can queue for seconds), workers 1, the sync API run on BentoML's thread (threads=1 default).
Overrides for tuning: PEER_MAX_BATCH, PEER_MAX_LATENCY_MS.
"""
import os
import pathlib

import bentoml
import numpy as np

MODEL = os.environ.get("PEER_MODEL", str(pathlib.Path(__file__).resolve().parents[3] / "models/default/model.onnx"))
MAX_BATCH = int(os.environ.get("PEER_MAX_BATCH", "32"))
MAX_LATENCY_MS = int(os.environ.get("PEER_MAX_LATENCY_MS", "60000"))
THREADS = int(os.environ.get("PEER_INTRA_OP_THREADS", "2"))


def pad(seqs):
    """A batch padded to its longest sequence (pad id 0) with its attention mask."""
    n, longest = len(seqs), max(len(s) for s in seqs)
    ids = np.zeros((n, longest), np.int64)
    mask = np.zeros((n, longest), np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


@bentoml.service(workers=1, resources={"cpu": "2"}, traffic={"timeout": 120})
class Scorer:
    def __init__(self) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        self.session = ort.InferenceSession(MODEL, so, providers=["CPUExecutionProvider"])

    @bentoml.api(batchable=True, batch_dim=0, max_batch_size=MAX_BATCH, max_latency_ms=MAX_LATENCY_MS)
    def score(self, ids: list[list[int]]) -> list[float]:
        arr, mask = pad(ids)
        out = self.session.run(["scores"], {"input_ids": arr, "attention_mask": mask})[0]
        return [float(x) for x in out]
