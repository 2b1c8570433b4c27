"""Ray Serve peer: the reward model (ONNX, onnxruntime) behind Ray Serve's HTTP proxy, one replica,
with Ray Serve's own dynamic batching (`@serve.batch`).

Followed: Ray Serve "Dynamic Request Batching" (docs.ray.io/en/latest/serve/advanced-guides/dyn-req-batch.html:
an `async def` method decorated with `@serve.batch(max_batch_size=..., batch_wait_timeout_s=...)` that takes a
list and returns a list of the same length, called once per request from `__call__`) and the API reference
of ray.serve.batch / ray.serve.start(http_options=...) / ray.serve.run, ray[serve]==2.60.0.
Run with the peers' venv (/tmp/peers/venv), from anywhere:

    /tmp/peers/venv/bin/python serve_ray.py --port 8011

POST /  {"ids": [101, ..., 102]}  ->  {"score": float}.  One sequence per request.

Settings: max_batch_size 32 (rmscore's --max-batch-size default), batch_wait_timeout_s 0.01 (Ray's default),
max_ongoing_requests 64 (Ray's default is 5, which would cap every batch at 5 requests; the batching guide
needs a replica to hold at least a batch's worth, and 64 is the largest concurrency driven), one replica
with num_cpus=2 (the machine), the dashboard off (not part of serving). Overrides for tuning:
PEER_MAX_BATCH, PEER_BATCH_WAIT_S, PEER_MAX_ONGOING.
"""
import argparse
import os
import pathlib
import signal
import sys
import time

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request

MODEL = os.environ.get("PEER_MODEL", str(pathlib.Path(__file__).resolve().parents[3] / "models/default/model.onnx"))
MAX_BATCH = int(os.environ.get("PEER_MAX_BATCH", "32"))
WAIT_S = float(os.environ.get("PEER_BATCH_WAIT_S", "0.01"))
MAX_ONGOING = int(os.environ.get("PEER_MAX_ONGOING", "64"))
THREADS = int(os.environ.get("PEER_INTRA_OP_THREADS", "2"))


# Each peer script is self-contained on purpose: it runs under its own framework (Ray ships the deployment
# class to its worker processes, BentoML imports the file as a service), so nothing is shared between them.

def pad(seqs):
    """A batch padded to its longest sequence (pad id 0) with its attention mask."""
    n, longest = len(seqs), max(len(s) for s in seqs)
    ids = np.zeros((n, longest), np.int64)
    mask = np.zeros((n, longest), np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


@serve.deployment(num_replicas=1, max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 2})
class Scorer:
    def __init__(self, model_path: str):
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        self.session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def score(self, seqs: list[list[int]]) -> list[float]:
        ids, mask = pad(seqs)
        out = self.session.run(["scores"], {"input_ids": ids, "attention_mask": mask})[0]
        return [float(x) for x in out]

    async def __call__(self, request: Request) -> dict:
        body = await request.json()
        return {"score": await self.score(body["ids"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--host", default="127.0.0.1")
    a = ap.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # a fresh local cluster
    serve.start(http_options={"host": a.host, "port": a.port})
    serve.run(Scorer.bind(MODEL), route_prefix="/")
    # After ray.init (which installs its own handler): SIGTERM -> SystemExit -> serve/ray shutdown below,
    # which stops the local Ray processes this started (the driver also kills its session's leftovers).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"ray serve ready on {a.host}:{a.port} (ray {ray.__version__}, max_batch_size {MAX_BATCH}, "
          f"batch_wait_timeout_s {WAIT_S}, max_ongoing_requests {MAX_ONGOING})", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
