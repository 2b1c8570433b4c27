"""NVIDIA PyTriton peer: the reward model (ONNX, onnxruntime) behind Triton Inference Server (the tritonserver
binary PyTriton bundles, CPU only) with Triton's dynamic batcher, one model instance.

Followed: PyTriton "Binding models to Triton" / "Deploying models" (triton-inference-server.github.io/pytriton:
`Triton(config=TritonConfig(...))`, `triton.bind(model_name, infer_func, inputs=[Tensor(...)], outputs=[...],
config=ModelConfig(max_batch_size=..., batcher=DynamicBatcher(...)))`, `triton.serve()`, the `@batch`
decorator that concatenates the requests of a dynamic batch), nvidia-pytriton==0.7.0 (its own venv,
/tmp/peers/venv-pytriton: it needs numpy<2). Triton's dynamic batcher only puts requests with equal input
shapes in one batch (Triton user guide, "Ragged Batching": "the client would need to pad the input tensors in
the requests to the same shape"; PyTriton's Tensor has no allow_ragged_batch), so, as that page says, each
client pads its one sequence to a fixed length (the length mix's maximum, 256) with attention_mask 0 on the
padding, and this server cuts every batch back to its longest real sequence before running it: the model runs
the same padded-to-longest batch as the other peers; only the request bodies are longer.

    /tmp/peers/venv-pytriton/bin/python serve_pytriton.py --http-port 8013 --grpc-port 8014 --metrics-port 8015

KServe v2 HTTP: POST /v2/models/reward/infer with inputs input_ids and attention_mask, INT64 [1, 256];
output scores FP32 [1, 1].

Settings: max_batch_size 32 (rmscore's --max-batch-size default), DynamicBatcher(max_queue_delay_microseconds=0)
(PyTriton's and Triton's default; Triton's guide says to start there), one instance (PyTriton's default).
Overrides: PEER_MAX_BATCH, PEER_QUEUE_DELAY_US.
"""
import argparse
import os
import pathlib
import signal
import sysconfig

# PyTriton's workspace (sockets, a copy of tritonserver) goes under $PYTRITON_HOME, else ~/.cache/pytriton;
# read when pytriton is imported.
os.environ.setdefault("PYTRITON_HOME", "/tmp/peers/pytriton_home")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from pytriton.decorators import batch  # noqa: E402
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402

MODEL = os.environ.get("PEER_MODEL", str(pathlib.Path(__file__).resolve().parents[3] / "models/default/model.onnx"))
MAX_BATCH = int(os.environ.get("PEER_MAX_BATCH", "32"))
QUEUE_DELAY_US = int(os.environ.get("PEER_QUEUE_DELAY_US", "0"))
THREADS = int(os.environ.get("PEER_INTRA_OP_THREADS", "2"))

so = ort.SessionOptions()
so.intra_op_num_threads = THREADS
session = ort.InferenceSession(MODEL, so, providers=["CPUExecutionProvider"])


@batch
def infer(input_ids: np.ndarray, attention_mask: np.ndarray):
    longest = max(1, int(attention_mask.sum(axis=1).max()))  # cut the client's fixed padding back
    ids = np.ascontiguousarray(input_ids[:, :longest], dtype=np.int64)
    mask = np.ascontiguousarray(attention_mask[:, :longest], dtype=np.int64)
    scores = session.run(["scores"], {"input_ids": ids, "attention_mask": mask})[0]
    return {"scores": scores.astype(np.float32).reshape(-1, 1)}


def _match_stub_libpython() -> None:
    """Triton's Python backend stub links libpython3.X.so by soname: on this Debian machine the system's
    (3.11.2) came first, whose stdlib differs from the interpreter's (pyenv 3.11.7) that the stub imports,
    and the model failed to load (`_thread.RLock` has no `_recursion_count`). Put this interpreter's own
    shared libpython first on the search path of the processes PyTriton starts."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [libdir] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])


def _sigterm(*_):
    raise KeyboardInterrupt  # triton.serve() stops Triton and cleans its workspace on SIGINT only


def main() -> None:
    _match_stub_libpython()

    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, default=8013)
    ap.add_argument("--grpc-port", type=int, default=8014)
    ap.add_argument("--metrics-port", type=int, default=8015)
    a = ap.parse_args()
    config = TritonConfig(http_address="127.0.0.1", http_port=a.http_port, grpc_address="127.0.0.1",
                          grpc_port=a.grpc_port, metrics_address="127.0.0.1", metrics_port=a.metrics_port,
                          allow_gpu_metrics=False)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="reward",
            infer_func=infer,
            inputs=[Tensor(name="input_ids", dtype=np.int64, shape=(-1,)),
                    Tensor(name="attention_mask", dtype=np.int64, shape=(-1,))],
            outputs=[Tensor(name="scores", dtype=np.float32, shape=(1,))],
            config=ModelConfig(max_batch_size=MAX_BATCH,
                               batcher=DynamicBatcher(max_queue_delay_microseconds=QUEUE_DELAY_US)),
            strict=True,
        )
        print(f"pytriton ready on 127.0.0.1:{a.http_port} (max_batch_size {MAX_BATCH}, "
              f"max_queue_delay_microseconds {QUEUE_DELAY_US})", flush=True)
        signal.signal(signal.SIGTERM, _sigterm)
        triton.serve()  # blocks; SIGINT (or SIGTERM, above) stops Triton and the model proxy


if __name__ == "__main__":
    main()
