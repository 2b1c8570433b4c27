#!/usr/bin/env python3
"""The C++ server's serving overhead, side by side in one run (docs/cpp_bench.md).

On one fixed, seeded set of batches it measures, per repetition and in a rotated order:

  (a) in-process ONNX Runtime through the server's own code (build/cpp/rmscore-ort-driver),
  (b) the C++ gRPC server at saturation (closed loop, every request one whole batch),
  (c) the Python gRPC ONNX Runtime server at saturation, the same way,

and from those: serving overhead = 1 - server / in-process throughput (same repetition), median
latency at low load (one client, one small request at a time) against that request's in-process
compute + the configured queue delay, idle RSS after ready, start-up time to SERVING, and (once)
parity of the driver's scores vs the manifest's eager PyTorch fp32 golden scores. K repetitions,
mean ± 95% CI (Student's t). Writes bench_cpp.json and bench_cpp.md to --out.

    .venv/bin/python scripts/bench_cpp.py --out runs/cpp_bench            # K=3, ~10-15 min on 2 loaded cores
    .venv/bin/python scripts/bench_cpp.py --preset tiny --out /tmp/cb     # the machinery, ~1 min

Batches: the sequences sorted longest first, cut greedily at --max-batch-size / --max-batch-tokens.
Every batch is then full by a limit: no sequence of any other batch can join it. The servers run
with --batching fifo and those limits, so each request is exactly one server batch, whatever order
requests arrive in, and a full batch runs without waiting for the queue delay. The last cut, which
is not full, is dropped. The servers' batch counters (/metrics) are checked against the requests.
The servers start through rmscore.tools.launch.start on 127.0.0.1, plaintext and without an auth token:
the overhead measured is the serving's, not TLS's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DRIVER = ROOT / os.environ.get("RMSCORE_ORT_DRIVER", "build/cpp/rmscore-ort-driver")
KINDS = ("cpp-grpc", "py-grpc-onnxruntime")
SCORE_METHOD = "/rmscore.v1.RewardModel/Score"

GOALS = {"overhead": 0.05, "latency_excess_ms": 1.0, "parity": 5.7e-6}

PRESETS = {
    "default": dict(sequences=512, lengths="lognormal:160:0.6:32:512", repeats=3, passes=1,
                    concurrency=4, latency_requests=40, probe_repetitions=20, small_seqs=4),
    "tiny": dict(sequences=72, lengths="lognormal:24:0.3:16:48", repeats=2, passes=1,
                 concurrency=3, latency_requests=5, probe_repetitions=5, small_seqs=2),
}

_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench_cpp {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---- workload -----------------------------------------------------------------------------------
def full_batches(seqs: list[list[int]], max_batch_size: int, max_batch_tokens: int) -> tuple[list[list[int]], int]:
    """Indices of `seqs` cut longest-first into batches that are each full by a limit.

    A batch starts at its longest sequence and takes the next (shorter or equal) ones while
    count <= max_batch_size and count * longest <= max_batch_tokens. It ends because one more
    sequence of any length would break a limit, so FIFO batching never merges two of them. The
    last cut is kept only when it is full as well; returns (batches, sequences dropped).
    """
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))
    batches, cur = [], []
    for i in order:
        longest = len(seqs[cur[0]]) if cur else len(seqs[i])
        if cur and (len(cur) + 1 > max_batch_size or (len(cur) + 1) * longest > max_batch_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    dropped = 0
    if cur:
        longest = len(seqs[cur[0]])
        if len(cur) == max_batch_size or (len(cur) + 1) * longest > max_batch_tokens:
            batches.append(cur)
        else:
            dropped = len(cur)
    return batches, dropped


def make_workload(a) -> dict:
    import numpy as np

    from rmscore_loadtest.workload import LengthMix, make_rollout

    mix = LengthMix.parse(a.lengths)
    rng = np.random.default_rng(a.seed)
    seqs = make_rollout(rng, a.sequences, mix, a.vocab_size)
    idx, dropped = full_batches(seqs, a.max_batch_size, a.max_batch_tokens)
    if not idx:
        raise SystemExit("bench_cpp: no full batch can be cut from this workload; give more --sequences")
    small = make_rollout(np.random.default_rng(a.seed + 1), a.small_seqs, mix, a.vocab_size)
    batches = [[seqs[i] for i in b] for b in idx]
    return {"mix": mix.describe(), "batches": batches, "small": small, "dropped": dropped,
            "sizes": [len(b) for b in batches], "longest": [max(map(len, b)) for b in batches],
            "small_lengths": [len(x) for x in small], "sequences": sum(len(b) for b in batches), "real_tokens": sum(len(s) for b in batches for s in b),
            "padded_tokens": sum(len(b) * max(map(len, b)) for b in batches)}


# ---- in-process ---------------------------------------------------------------------------------
def session_flags(a) -> list[str]:
    return ["--model", str(a.model), "--intra-op-threads", str(a.intra_op_threads),
            "--inter-op-threads", str(a.inter_op_threads)]


def run_parity(a) -> dict:
    p = subprocess.run([str(DRIVER), "--parity", *session_flags(a)], check=True, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- servers ------------------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def metric_sum(metrics_port: int, name: str) -> float:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Server:
    """A server kind through rmscore.tools.launch.start (plaintext, no auth token, on 127.0.0.1), timed to SERVING."""

    def __init__(self, kind: str, a, tmp: pathlib.Path):
        from rmscore.tools import launch
        self.kind = kind
        t0 = time.monotonic()
        # Health polled every 20 ms: start-up time is a figure here.
        self.server = launch.start(kind, ready_timeout_s=a.startup_timeout_s, poll_s=0.02,
                                   log_dir=tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp), model=str(a.model),
                                   batching="fifo", max_batch_size=a.max_batch_size,
                                   max_batch_tokens=a.max_batch_tokens, max_queue_delay_ms=a.max_queue_delay_ms,
                                   intra_op_threads=a.intra_op_threads, inter_op_threads=a.inter_op_threads)
        self.startup_s = time.monotonic() - t0
        self.proc, self.port, self.metrics_port = self.server.proc, self.server.port, self.server.metrics_port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def idle_rss_mib(self) -> tuple[float, float]:
        """(the server process, the process and all its descendants), MiB of VmRSS."""
        own = rss_kib(self.proc.pid)
        tree = own + sum(rss_kib(p) for p in descendants(self.proc.pid) if pathlib.Path(f"/proc/{p}").exists())
        return own / 1024, tree / 1024

    def stop(self) -> None:
        self.server.stop(60)


def request_bytes(seqs: list[list[int]]) -> bytes:
    from rmscore_client.v1 import reward_pb2

    return reward_pb2.ScoreRequest(
        sequences=[reward_pb2.Sequence(tokens=reward_pb2.TokenIds(ids=s)) for s in seqs]).SerializeToString()


def score_callable(channel):
    """Score with pre-serialised requests: the load generator spends no time building messages."""
    from rmscore_client.v1 import reward_pb2

    return channel.unary_unary(SCORE_METHOD, request_serializer=None,
                               response_deserializer=reward_pb2.ScoreResponse.FromString)


def low_load_latency(target: str, small: bytes, n: int, timeout_s: float) -> list[float]:
    import grpc

    with grpc.insecure_channel(target) as ch:
        call = score_callable(ch)
        for _ in range(3):  # warm-up: connection, first run of this shape
            call(small, timeout=timeout_s)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            call(small, timeout=timeout_s)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def saturate(target: str, reqs: list[bytes], sizes: list[int], order: list[int], concurrency: int,
             timeout_s: float) -> tuple[float, dict[int, list[float]]]:
    """Closed loop: `concurrency` clients, each sending the next batch of `order` when its last answers.

    Returns (wall seconds from first send to last answer, scores by batch index of the last time
    each batch was sent)."""
    import grpc

    lock = threading.Lock()
    nxt = iter(order)
    scores: dict[int, list[float]] = {}
    errors: list[BaseException] = []
    channels = [grpc.insecure_channel(target) for _ in range(concurrency)]
    calls = [score_callable(ch) for ch in channels]
    for ch in channels:  # connect before the clock starts
        grpc.channel_ready_future(ch).result(timeout=30)

    def client(call):
        try:
            while True:
                with lock:
                    b = next(nxt, None)
                if b is None:
                    return
                r = call(reqs[b], timeout=timeout_s)
                if len(r.scores) != sizes[b]:
                    raise RuntimeError(f"batch {b}: {len(r.scores)} scores for {sizes[b]} sequences")
                scores[b] = list(r.scores)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in calls]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for ch in channels:
        ch.close()
    if errors:
        raise errors[0]
    return wall, scores


class Driver:
    """The C++ driver kept alive (--interactive), so in-process passes alternate with server passes."""

    def __init__(self, a, batches_file: pathlib.Path, warmup: int):
        cmd = [str(DRIVER), "--batches", str(batches_file), "--interactive", "--warmup", str(warmup),
               *session_flags(a)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"rmscore-ort-driver exited with {self.proc.wait()}")
        r = json.loads(line)
        if "error" in r:
            raise RuntimeError(f"rmscore-ort-driver: {r['error']}")
        return r

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def warmup_batches(a, n: int) -> int:
    """Untimed batches before timing (of the `n`), the same in-process and on the servers."""
    return min(n, 2 * a.concurrency)


def repetition(k: int, a, wl: dict, reqs: list[bytes], small: bytes, batches_file: pathlib.Path,
               tmp: pathlib.Path) -> dict:
    """One repetition: fresh processes, every figure, configurations in a rotated order throughout."""
    configs = ["inproc", *a.kinds]
    order = configs[k % len(configs):] + configs[:k % len(configs)]
    say(f"repetition {k + 1}/{a.repeats}: order {', '.join(order)}")
    n = len(reqs)
    rep: dict = {"order": order, "inproc": {}}
    procs: dict = {}
    try:
        say("  in-process: starting the C++ driver")
        procs["inproc"] = Driver(a, batches_file, warmup_batches(a, n))
        for kind in (c for c in order if c != "inproc"):  # one at a time, the others idle
            srv = procs[kind] = Server(kind, a, tmp)
            time.sleep(a.settle_s)
            own, tree = srv.idle_rss_mib()
            rep[kind] = {"startup_s": srv.startup_s, "idle_rss_mib": own, "idle_rss_tree_mib": tree}
            say(f"  {kind}: SERVING after {srv.startup_s:.2f} s, idle RSS {own:.0f} MiB (with children {tree:.0f})")
        for cfg in order:  # low load
            if cfg == "inproc":
                r = procs[cfg].ask(f"probe {a.probe_repetitions}")
                rep[cfg]["small_ms"] = r["median_wall_s"] * 1e3
                say(f"  in-process: low-load request compute {rep[cfg]['small_ms']:.2f} ms "
                    f"(median of {a.probe_repetitions})")
            else:
                lat = low_load_latency(procs[cfg].target, small, a.latency_requests, a.rpc_timeout_s)
                rep[cfg].update(latency_ms=lat, latency_median_ms=statistics.median(lat))
                say(f"  {cfg}: low load, {len(lat)} requests of {len(wl['small'])} sequences: "
                    f"median {statistics.median(lat):.2f} ms")
        for kind in a.kinds:  # server warm-up, as many batches as the driver's
            saturate(procs[kind].target, reqs, wl["sizes"], list(range(warmup_batches(a, n))), a.concurrency,
                     a.rpc_timeout_s)
            rep[kind].update(saturation_wall_s=0.0, requests=0, batches_run=0.0, pass_seq_s=[])
        rep["inproc"].update(pass_wall_s=[], pass_seq_s=[])
        for p in range(a.passes):  # saturation, alternating whole passes
            for cfg in order:
                if cfg == "inproc":
                    r = procs[cfg].ask("pass")
                    rep[cfg]["pass_wall_s"].append(r["pass_wall_s"])
                    rep[cfg]["pass_seq_s"].append(r["sequences_per_s"])
                    rep[cfg]["scores"] = r["scores"]
                    say(f"  in-process: pass {p + 1}/{a.passes}: {r['sequences_per_s']:.1f} sequences/s")
                    continue
                srv, x = procs[cfg], rep[cfg]
                before = metric_sum(srv.metrics_port, "rmscore_batch_size_count")
                wall, scores = saturate(srv.target, reqs, wl["sizes"], list(range(n)), a.concurrency, a.rpc_timeout_s)
                ran = metric_sum(srv.metrics_port, "rmscore_batch_size_count") - before
                x["saturation_wall_s"] += wall
                x["requests"] += n
                x["batches_run"] += ran
                x["pass_seq_s"].append(wl["sequences"] / wall)
                x["scores"] = [v for b in range(n) for v in scores[b]]
                say(f"  {cfg}: pass {p + 1}/{a.passes}: {wl['sequences'] / wall:.1f} sequences/s, "
                    f"{a.concurrency} clients, {n} requests -> {ran:.0f} server batches")
    finally:
        for proc in procs.values():
            proc.stop()
    rep["inproc"]["seq_s"] = wl["sequences"] * a.passes / sum(rep["inproc"]["pass_wall_s"])
    for kind in a.kinds:
        x = rep[kind]
        x["saturation_seq_s"] = wl["sequences"] * a.passes / x["saturation_wall_s"]
        x["max_abs_diff_vs_inproc"] = max(abs(u - v) for u, v in zip(x.pop("scores"), rep["inproc"]["scores"]))
        say(f"  overhead {kind}: {1 - x['saturation_seq_s'] / rep['inproc']['seq_s']:+.1%}")
    rep["inproc"].pop("scores")
    return rep


# ---- statistics and report ----------------------------------------------------------------------
def ci(values) -> dict:
    from rmscore_loadtest.stats import mean_ci

    return mean_ci([v for v in values if v is not None]).as_dict()


def fmt(c: dict, digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
    from rmscore_loadtest.stats import CI

    x = CI(**{**c, **{k: c[k] * scale for k in ("mean", "lo", "hi", "half_width", "sd")}})
    return x.fmt(digits) + unit


def summarise(reps: list[dict], kinds: list[str], a) -> dict:
    s: dict = {"inproc_seq_s": ci(r["inproc"]["seq_s"] for r in reps),
               "inproc_small_ms": ci(r["inproc"]["small_ms"] for r in reps)}
    for k in kinds:
        rows = [r[k] for r in reps]
        s[k] = {
            "saturation_seq_s": ci(x["saturation_seq_s"] for x in rows),
            "overhead": ci(1 - x["saturation_seq_s"] / r["inproc"]["seq_s"] for x, r in zip(rows, reps)),
            "latency_median_ms": ci(x["latency_median_ms"] for x in rows),
            "latency_expected_ms": ci(r["inproc"]["small_ms"] + a.max_queue_delay_ms for r in reps),
            "latency_excess_ms": ci(x["latency_median_ms"] - r["inproc"]["small_ms"] - a.max_queue_delay_ms
                                    for x, r in zip(rows, reps)),
            "idle_rss_mib": ci(x["idle_rss_mib"] for x in rows),
            "idle_rss_tree_mib": ci(x["idle_rss_tree_mib"] for x in rows),
            "startup_s": ci(x["startup_s"] for x in rows),
            "batches_per_request": ci(x["batches_run"] / x["requests"] for x in rows),
            "max_abs_diff_vs_inproc": max((x["max_abs_diff_vs_inproc"] or 0.0) for x in rows),
        }
    if set(KINDS) <= set(kinds):
        s["cpp_over_py_throughput"] = ci(r["cpp-grpc"]["saturation_seq_s"] / r["py-grpc-onnxruntime"]["saturation_seq_s"]
                                         for r in reps)
    return s


def goal(ok: bool) -> str:
    return "meets" if ok else "misses"


def markdown(rec: dict) -> str:
    a, s, wl, kinds = rec["settings"], rec["summary"], rec["workload"], rec["settings"]["kinds"]
    K = len(rec["repetitions"])
    lines = [
        "# C++ serving overhead (scripts/bench_cpp.py)", "",
        f"{rec['started']}, {rec['machine']['cpus']} CPUs, load average at start {rec['machine']['loadavg_start']}, "
        f"at end {rec['machine']['loadavg_end']}. K={K} repetitions, mean ± 95% CI (Student's t, df=K-1); "
        "configurations interleaved in a rotated order within each repetition.", "",
        f"Workload: {wl['sequences']} sequences ({wl['mix']}, seed {a['seed']}; {wl['dropped']} dropped with the "
        f"last, partial cut) in {len(wl['sizes'])} batches, longest first, each full at max_batch_size "
        f"{a['max_batch_size']} / max_batch_tokens {a['max_batch_tokens']} (padding efficiency "
        f"{wl['real_tokens'] / wl['padded_tokens']:.3f}). Threads: intra-op {a['intra_op_threads']}, "
        f"inter-op {a['inter_op_threads']}, everywhere. Servers: --batching fifo, max_queue_delay "
        f"{a['max_queue_delay_ms']} ms; saturation = {a['concurrency']} closed-loop gRPC clients, every request "
        f"one whole batch, {a['passes']} pass(es) after a warm-up.", "",
        "| figure | in-process ORT (C++ driver) | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
        f"| throughput, sequences/s | {fmt(s['inproc_seq_s'])} | "
        + " | ".join(fmt(s[k]['saturation_seq_s']) for k in kinds) + " |",
        "| serving overhead, 1 - server/in-process | - | "
        + " | ".join(fmt(s[k]['overhead'], 2, 100, ' %') for k in kinds) + " |",
        f"| low-load median latency, {len(wl['small_lengths'])}-sequence request, ms | "
        f"compute {fmt(s['inproc_small_ms'])} | " + " | ".join(fmt(s[k]['latency_median_ms']) for k in kinds) + " |",
        f"| latency - (compute + {a['max_queue_delay_ms']} ms delay), ms | - | "
        + " | ".join(fmt(s[k]['latency_excess_ms'], 2) for k in kinds) + " |",
        "| idle RSS after ready, MiB | - | " + " | ".join(fmt(s[k]['idle_rss_mib']) for k in kinds) + " |",
        "| start-up to SERVING, s | - | " + " | ".join(fmt(s[k]['startup_s']) for k in kinds) + " |",
        "| server batches per request (1 = same batches) | - | "
        + " | ".join(fmt(s[k]['batches_per_request']) for k in kinds) + " |",
        "| max abs score diff vs in-process | - | "
        + " | ".join(f"{s[k]['max_abs_diff_vs_inproc']:.2g}" for k in kinds) + " |",
    ]
    if "cpp_over_py_throughput" in s:
        lines += ["", f"C++ / Python server throughput (per repetition, then averaged): "
                      f"{fmt(s['cpp_over_py_throughput'])}x."]
    p = rec["parity"]
    lines += ["", f"Parity (driver `--parity`, {p['golden_sequences']} golden inputs alone and as one padded batch, "
                  f"vs the manifest's eager PyTorch fp32 scores): max abs diff {p['max_abs_diff']:.3g} "
                  f"({goal(p['max_abs_diff'] <= GOALS['parity'])} the goal <= {GOALS['parity']:g}).", "", "Goals:"]
    if "cpp-grpc" in kinds:
        c = s["cpp-grpc"]
        lines += [f"- C++ serving overhead {fmt(c['overhead'], 2, 100, ' %')}: mean "
                  f"{goal(c['overhead']['mean'] <= GOALS['overhead'])} the goal <= {GOALS['overhead']:.0%}.",
                  f"- C++ low-load latency {fmt(c['latency_excess_ms'], 2)} ms over compute + delay: mean "
                  f"{goal(abs(c['latency_excess_ms']['mean']) <= GOALS['latency_excess_ms'])} the goal within "
                  f"{GOALS['latency_excess_ms']:g} ms."]
    if rec.get("note"):
        lines += ["", f"Note: {rec['note']}"]
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="default")
    p.add_argument("--out", type=pathlib.Path, required=True, help="output directory (bench_cpp.json, bench_cpp.md, raw/)")
    p.add_argument("--model", type=pathlib.Path, default=ROOT / "models/default")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"server kinds, comma separated, of {', '.join(KINDS)}")
    p.add_argument("--sequences", type=int)
    p.add_argument("--lengths", help="lognormal:MEDIAN:SIGMA:MIN:MAX | uniform:MIN:MAX | fixed:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", "-K", type=int)
    p.add_argument("--passes", type=int, help="measured passes over all batches per repetition")
    p.add_argument("--concurrency", type=int, help="closed-loop clients at saturation (>= 3 keeps a full batch queued)")
    p.add_argument("--latency-requests", type=int)
    p.add_argument("--small-seqs", type=int, help="sequences in the low-load request")
    p.add_argument("--probe-repetitions", type=int, help="in-process timings of the low-load request")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=8192)
    p.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    p.add_argument("--intra-op-threads", type=int, default=2)
    p.add_argument("--inter-op-threads", type=int, default=1)
    p.add_argument("--settle-s", type=float, default=1.0, help="wait after SERVING before reading idle RSS")
    p.add_argument("--startup-timeout-s", type=float, default=300)
    p.add_argument("--rpc-timeout-s", type=float, default=300)
    p.add_argument("--note", default="")
    a = p.parse_args(argv)
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.kinds = [k for k in a.kinds.split(",") if k and k != "none"]
    bad = [k for k in a.kinds if k not in KINDS]
    if bad:
        p.error(f"--kinds: unknown {bad}; choose from {', '.join(KINDS)} (or none)")
    if a.repeats < 1 or a.passes < 1 or a.concurrency < 1 or a.latency_requests < 1 or a.small_seqs < 1:
        p.error("--repeats, --passes, --concurrency, --latency-requests and --small-seqs must be >= 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if not DRIVER.exists():
        print(f"bench_cpp: {DRIVER} missing: run scripts/build_cpp.sh", file=sys.stderr)
        return 2
    if "cpp-grpc" in a.kinds:
        from rmscore.tools import launch
        if not launch.CPP_BINARY.exists():
            print(f"bench_cpp: {launch.CPP_BINARY} missing: run scripts/build_cpp.sh", file=sys.stderr)
            return 2
    manifest = json.loads((a.model / "manifest.json").read_text())
    a.vocab_size = int(manifest["vocab_size"])
    out = a.out
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    loadavg_start = os.getloadavg()

    wl = make_workload(a)
    say(f"workload: {wl['sequences']} sequences in {len(wl['sizes'])} full batches (sizes {wl['sizes']}), "
        f"{wl['dropped']} dropped; low-load request: {len(wl['small'])} sequences")
    batches_file = raw / "batches.json"
    batches_file.write_text(json.dumps({"batches": wl["batches"], "probe": wl["small"]}))
    reqs = [request_bytes(b) for b in wl["batches"]]
    small = request_bytes(wl["small"])

    say("parity: driver --parity")
    parity = run_parity(a)
    say(f"parity: max abs diff {parity['max_abs_diff']:.3g} vs {parity['reference']}")

    with tempfile.TemporaryDirectory(prefix="bench-cpp-") as tmpd:
        reps = [repetition(k, a, wl, reqs, small, batches_file, pathlib.Path(tmpd)) for k in range(a.repeats)]

    rec = {
        "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_start": [round(x, 2) for x in loadavg_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "settings": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(a).items()},
        "goals": GOALS,
        "workload": {k: v for k, v in wl.items() if k not in ("batches", "small")},
        "parity": parity,
        "repetitions": reps,
        "note": a.note,
    }
    rec["summary"] = summarise(reps, a.kinds, a)
    (out / "bench_cpp.json").write_text(json.dumps(rec, indent=1) + "\n")
    md = markdown(rec)
    (out / "bench_cpp.md").write_text(md)
    say(f"wrote {out / 'bench_cpp.json'} and {out / 'bench_cpp.md'}")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
