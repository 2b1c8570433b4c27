"""One 1-thread ONNX Runtime session on the default model, batch 1 x 128 tokens, 20 runs: wall clock and
the thread's CPU time per run, alone and beside three busy processes (killed after), twice. From the
repository root: `.venv/bin/python docs/bench/cost-timing_2026-12-07/cpu_and_wall.py`."""
import time, numpy as np, onnxruntime as ort, subprocess, sys
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
s = ort.InferenceSession("models/default/model.onnx", so, providers=["CPUExecutionProvider"])
def runs(n=20, B=1, L=128):
    ids = np.ones((B, L), np.int64); w = c = 0
    for _ in range(n):
        a, ca = time.perf_counter(), time.thread_time()
        s.run(["scores"], {"input_ids": ids, "attention_mask": ids})
        w += time.perf_counter() - a; c += time.thread_time() - ca
    return 1e3 * w / n, 1e3 * c / n
runs(5)
for rep in range(2):
    print("idle:      wall %.1f ms, thread CPU %.1f ms" % runs(), flush=True)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    time.sleep(0.5)
    print("3 hogs:    wall %.1f ms, thread CPU %.1f ms" % runs(), flush=True)
    for h in hogs: h.kill(); h.wait()
    time.sleep(0.5)
