"""`rmscore bench --overhead`: the C++ server's serving overhead, side by side in one run (docs/cpp_bench.md).

On one fixed, seeded set of full batches, per repetition and in a rotated order:

  (a) in-process ONNX Runtime through the C++ server's own code (build/cpp/rmscore-ort-driver, the
      same session options), passes over every batch for the preset's window;
  (b) the C++ gRPC server at saturation: a closed loop (loadgen) of every request one whole batch;
  (c) the Python gRPC ONNX Runtime server the same way.

From those: serving overhead = 1 - server / in-process throughput (same repetition), C++ / Python
throughput, the median latency at low load (one client, one request of the preset's chunk size at a
time) against that request's in-process compute + the queue delay, idle RSS after ready, start-up
time to SERVING, the server batches per request (1: each request ran as exactly one batch), the
servers' scores against the driver's, and (once) the driver's parity against the manifest's eager
PyTorch fp32 golden scores. K = the preset's repetitions; mean ± 95% CI (stats.py). Writes
OUT/overhead.json and OUT/overhead.md, and prints the table.

Batches: the sequences sorted longest first, cut greedily at max_batch_size / max_batch_tokens, so
each is full by a limit: no sequence of any other batch can join it. The servers run with
--batching fifo and those limits, and without the batch time bound (--max-batch-ms 0, which would
cut a batch of 8192 tokens here), so each request is exactly one server batch, whatever order
requests arrive in, and a full batch runs without waiting out the queue delay. The last cut, not
full, is dropped. Servers start through rmscore_tools.launch on 127.0.0.1, plaintext, no token.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from rmscore_tools import launch
from rmscore_tools import caller, loadgen, observe
from rmscore_tools.bench.presets import Settings
from rmscore_tools.stats import mean_ci
from rmscore_tools.workload import LengthMix, make_rollout

ROOT = launch.ROOT
DRIVER = ROOT / os.environ.get("RMSCORE_ORT_DRIVER", "build/cpp/rmscore-ort-driver")
KINDS = ("cpp-grpc", "py-grpc-onnxruntime")
GOALS = {"overhead": 0.05, "latency_excess_ms": 1.0, "parity": 5.7e-6}
PROBE_REPETITIONS = 20  # in-process timings of the low-load request (median)


def say(msg: str) -> None:
    print(f"[bench --overhead] {msg}", file=sys.stderr, flush=True)


def concurrency(s: Settings) -> int:
    """Closed-loop clients at saturation: the preset's highest level, within 3..4. Three keep a full
    batch queued behind the running one; more only queue longer."""
    return max(3, min(4, max(s.concurrency)))


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


def make_workload(s: Settings, vocab_size: int) -> dict:
    mix = LengthMix.parse(s.lengths)
    seqs = make_rollout(np.random.default_rng([s.seed, 21]), s.overhead_sequences, mix, vocab_size)
    idx, dropped = full_batches(seqs, s.max_batch_size, s.max_batch_tokens)
    if not idx:
        raise SystemExit(f"rmscore bench --overhead: no full batch can be cut from {s.overhead_sequences} "
                         f"sequences of {s.lengths}; give a preset with more")
    small = make_rollout(np.random.default_rng([s.seed, 22]), s.chunk_size, mix, vocab_size)
    batches = [[seqs[i] for i in b] for b in idx]
    return {"mix": mix.describe(), "batches": batches, "small": small, "dropped": dropped,
            "sizes": [len(b) for b in batches], "longest": [max(map(len, b)) for b in batches],
            "small_lengths": [len(x) for x in small], "sequences": sum(len(b) for b in batches),
            "real_tokens": sum(len(x) for b in batches for x in b),
            "padded_tokens": sum(len(b) * max(map(len, b)) for b in batches)}


# ---- the in-process driver ----------------------------------------------------------------------
def session_flags(s: Settings, model: str) -> list[str]:
    return ["--model", model, "--intra-op-threads", str(s.intra_op_threads),
            "--inter-op-threads", str(s.inter_op_threads)]


def run_parity(s: Settings, model: str) -> dict:
    p = subprocess.run([str(DRIVER), "--parity", *session_flags(s, model)], check=True, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    return json.loads(p.stdout.strip().splitlines()[-1])


class Driver:
    """The C++ driver kept alive (--interactive), so in-process passes alternate with server phases."""

    def __init__(self, s: Settings, model: str, batches_file: pathlib.Path, warmup: int):
        cmd = [str(DRIVER), "--batches", str(batches_file), "--interactive", "--warmup", str(warmup),
               *session_flags(s, model)]
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

    def saturate(self, window_s: float) -> dict:
        """Whole passes over every batch until `window_s` is spent (one at least)."""
        walls, seqs, r = [], 0, {}
        while not walls or sum(walls) < window_s:
            r = self.ask("pass")
            walls.append(r["pass_wall_s"])
            seqs += r["sequences"]
        return {"seq_s": seqs / sum(walls), "pass_wall_s": walls, "scores": r["scores"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


# ---- one server ----------------------------------------------------------------------------------
class Served:
    """A kind through rmscore_tools.launch.start (fifo, the preset's limits and threads), timed to SERVING."""

    def __init__(self, kind: str, s: Settings, model: str, tmp: pathlib.Path):
        self.kind, self.s = kind, s
        t0 = time.monotonic()
        # Health polled every 20 ms: start-up time is a figure here.
        self.server = launch.start(kind, ready_timeout_s=s.server_ready_timeout_s, poll_s=0.02,
                                   log_dir=tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp), model=model,
                                   **s.server_flags("fifo"), max_batch_ms=0)
        self.startup_s = time.monotonic() - t0

    def idle(self) -> dict:
        pid = self.server.proc.pid
        return {"startup_s": self.startup_s, "idle_rss_mib": observe.rss_mb(pid),
                "idle_rss_tree_mib": observe.tree_rss_mb(pid)}

    async def low_load(self, small: list[list[int]]) -> dict:
        """One client, one request at a time, for the preset's window."""
        c = caller.async_client("grpc", self.server.target, chunk_size=len(small), timeout_s=self.s.rpc_timeout_s)
        try:
            await loadgen.warmup(c, [small], 1, min(1.0, self.s.warmup_s))
            r = await loadgen.closed_loop(c, [small], 1, self.s.window_s, drain_timeout_s=self.s.rpc_timeout_s)
        finally:
            await c.close()
        return {"latency_ms": r["latencies_ms"], "latency_median_ms": r["latency_ms"]["p50"],
                "low_load_errors": r["errors"]}

    async def saturate(self, batches: list, clients: int) -> dict:
        """Warm-up, then the closed loop of whole batches; the server's batch counter around it, and
        every batch scored once more for the comparison with the driver."""
        s = self.s
        c = caller.async_client("grpc", self.server.target, chunk_size=s.max_batch_size, timeout_s=s.rpc_timeout_s)
        try:
            await loadgen.warmup(c, batches, clients, s.warmup_s)
            before = observe.metric(self.server, "rmscore_batch_size_count")
            r = await loadgen.closed_loop(c, batches, clients, s.window_s, s.settle_s,
                                          drain_timeout_s=s.rpc_timeout_s, max_settle_s=s.rpc_timeout_s)
            ran = observe.metric(self.server, "rmscore_batch_size_count") - before
            scores = [x for b in batches for x in await loadgen.score_set(c, b)]
        finally:
            await c.close()
        return {"saturation_seq_s": r["throughput_seq_s"], "saturation_errors": r["errors"],
                "requests": r["answered_all"], "batches_run": ran, "scores": scores}

    def stop(self) -> None:
        self.server.stop(60)


# ---- a repetition ------------------------------------------------------------------------------
def repetition(k: int, s: Settings, model: str, wl: dict, batches_file: pathlib.Path, kinds: list[str],
               tmp: pathlib.Path) -> dict:
    """Fresh processes, every figure, the configurations in an order rotated by repetition."""
    configs = ["inproc", *kinds]
    order = configs[k % len(configs):] + configs[:k % len(configs)]
    say(f"repetition {k + 1}/{s.repeats}: order {', '.join(order)}")
    clients = concurrency(s)
    rep: dict = {"order": order, "inproc": {}}
    procs: dict = {}
    try:
        procs["inproc"] = Driver(s, model, batches_file, min(len(wl["batches"]), 2 * clients))
        for kind in (c for c in order if c != "inproc"):  # all started; one measured at a time, the others idle
            procs[kind] = Served(kind, s, model, tmp)
            time.sleep(s.settle_s)
            rep[kind] = procs[kind].idle()
            say(f"  {kind}: SERVING after {rep[kind]['startup_s']:.2f} s, idle RSS "
                f"{rep[kind]['idle_rss_mib']:.0f} MiB (with children {rep[kind]['idle_rss_tree_mib']:.0f})")
        for cfg in order:
            rep[cfg].update(_measure(cfg, procs[cfg], wl, clients, s.window_s))
    finally:
        for proc in procs.values():
            proc.stop()
    inproc = rep["inproc"]
    for kind in kinds:
        x = rep[kind]
        x["max_abs_diff_vs_inproc"] = max(abs(u - v) for u, v in zip(x.pop("scores"), inproc["scores"]))
        say(f"  overhead {kind}: {1 - x['saturation_seq_s'] / inproc['seq_s']:+.1%}")
    inproc.pop("scores")
    return rep


def _measure(cfg: str, proc, wl: dict, clients: int, window_s: float) -> dict:
    """Low load, then saturation, of one configuration."""
    if cfg == "inproc":
        probe = proc.ask(f"probe {PROBE_REPETITIONS}")
        r = {"small_ms": probe["median_wall_s"] * 1e3, **proc.saturate(window_s)}
        say(f"  in-process: low-load request compute {r['small_ms']:.2f} ms; {r['seq_s']:.1f} sequences/s")
        return r

    async def both() -> dict:
        return {**await proc.low_load(wl["small"]), **await proc.saturate(wl["batches"], clients)}
    r = asyncio.run(both())
    say(f"  {cfg}: low load median {r['latency_median_ms']:.2f} ms; {r['saturation_seq_s']:.1f} sequences/s, "
        f"{clients} clients, {r['requests']} requests -> {r['batches_run']:.0f} server batches")
    return r


# ---- statistics and report ----------------------------------------------------------------------
def _ci(values) -> dict:
    return mean_ci([v for v in values if v is not None]).as_dict()


def summarise(reps: list[dict], kinds: list[str], s: Settings) -> dict:
    out: dict = {"inproc_seq_s": _ci(r["inproc"]["seq_s"] for r in reps),
                 "inproc_small_ms": _ci(r["inproc"]["small_ms"] for r in reps)}
    for k in kinds:
        rows = list(zip((r[k] for r in reps), (r["inproc"] for r in reps)))
        out[k] = {
            "saturation_seq_s": _ci(x["saturation_seq_s"] for x, _ in rows),
            "overhead": _ci(1 - x["saturation_seq_s"] / ip["seq_s"] for x, ip in rows),
            "latency_median_ms": _ci(x["latency_median_ms"] for x, _ in rows),
            "latency_expected_ms": _ci(ip["small_ms"] + s.max_queue_delay_ms for _, ip in rows),
            "latency_excess_ms": _ci(x["latency_median_ms"] - ip["small_ms"] - s.max_queue_delay_ms for x, ip in rows),
            "idle_rss_mib": _ci(x["idle_rss_mib"] for x, _ in rows),
            "idle_rss_tree_mib": _ci(x["idle_rss_tree_mib"] for x, _ in rows),
            "startup_s": _ci(x["startup_s"] for x, _ in rows),
            "batches_per_request": _ci(x["batches_run"] / x["requests"] for x, _ in rows),
            "max_abs_diff_vs_inproc": max((x["max_abs_diff_vs_inproc"] or 0.0) for x, _ in rows),
        }
    if set(KINDS) <= set(kinds):
        out["cpp_over_py_throughput"] = _ci(r["cpp-grpc"]["saturation_seq_s"] / r["py-grpc-onnxruntime"]["saturation_seq_s"]
                                            for r in reps)
    return out


def _goal(ok: bool) -> str:
    return "meets" if ok else "misses"


def markdown(rec: dict) -> str:
    from rmscore_tools.bench.report import fmt_ci as f

    s, summ, wl, kinds = rec["settings"], rec["summary"], rec["workload"], rec["kinds"]
    cells = lambda key, *a: " | ".join(f(summ[k][key], *a) for k in kinds)  # noqa: E731
    lines = [
        f"# C++ serving overhead (`rmscore bench --overhead --preset {s['preset']}`)", "",
        f"{rec['meta']['started']}, {rec['meta']['cores']} CPUs, load average at start "
        f"{rec['meta']['loadavg_start']}, at end {rec['meta']['loadavg_end']}. K={len(rec['repetitions'])} "
        "repetitions, mean ± 95% CI (Student's t, df=K-1); configurations in a rotated order per repetition.", "",
        f"Workload: {wl['sequences']} sequences ({wl['mix']}, seed {s['seed']}; {wl['dropped']} dropped with the "
        f"last, partial cut) in {len(wl['sizes'])} batches, longest first, each full at max_batch_size "
        f"{s['max_batch_size']} / max_batch_tokens {s['max_batch_tokens']} (padding efficiency "
        f"{wl['real_tokens'] / wl['padded_tokens']:.3f}). Threads: intra-op {s['intra_op_threads']}, inter-op "
        f"{s['inter_op_threads']}, everywhere. Servers: --batching fifo, max_queue_delay {s['max_queue_delay_ms']:g} "
        f"ms; saturation = {rec['concurrency']} closed-loop gRPC clients, every request one whole batch, "
        f"{s['warmup_s']:g} s warm-up, {s['settle_s']:g} s settling, {s['window_s']:g} s window; in-process = "
        f"whole passes over every batch for the window.", "",
        "| figure | in-process ORT (C++ driver) | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
        f"| throughput, sequences/s | {f(summ['inproc_seq_s'])} | {cells('saturation_seq_s')} |",
        f"| serving overhead, 1 - server/in-process | - | {cells('overhead', 2, 100, ' %')} |",
        f"| low-load median latency, {len(wl['small_lengths'])}-sequence request, ms | "
        f"compute {f(summ['inproc_small_ms'])} | {cells('latency_median_ms')} |",
        f"| latency - (compute + {s['max_queue_delay_ms']:g} ms delay), ms | - | {cells('latency_excess_ms', 2)} |",
        f"| idle RSS after ready, MiB | - | {cells('idle_rss_mib')} |",
        f"| start-up to SERVING, s | - | {cells('startup_s')} |",
        f"| server batches per request (1 = same batches) | - | {cells('batches_per_request')} |",
        "| max abs score diff vs in-process | - | "
        + " | ".join(f"{summ[k]['max_abs_diff_vs_inproc']:.2g}" for k in kinds) + " |",
    ]
    return "\n".join(lines + _verdicts(rec)) + "\n"


def _verdicts(rec: dict) -> list[str]:
    from rmscore_tools.bench.report import fmt_ci as f

    summ, p = rec["summary"], rec["parity"]
    lines = []
    if "cpp_over_py_throughput" in summ:
        lines += ["", f"C++ / Python server throughput (per repetition, then averaged): "
                      f"{f(summ['cpp_over_py_throughput'])}x."]
    lines += ["", f"Parity (driver `--parity`, {p['golden_sequences']} golden inputs alone and as one padded batch, "
                  f"vs the manifest's eager PyTorch fp32 scores): max abs diff {p['max_abs_diff']:.3g} "
                  f"({_goal(p['max_abs_diff'] <= GOALS['parity'])} the goal <= {GOALS['parity']:g}).", "", "Goals:"]
    if "cpp-grpc" in summ:
        c = summ["cpp-grpc"]
        lines += [f"- C++ serving overhead {f(c['overhead'], 2, 100, ' %')}: mean "
                  f"{_goal(c['overhead']['mean'] <= GOALS['overhead'])} the goal <= {GOALS['overhead']:.0%}.",
                  f"- C++ low-load latency {f(c['latency_excess_ms'], 2)} ms over compute + delay: mean "
                  f"{_goal(abs(c['latency_excess_ms']['mean']) <= GOALS['latency_excess_ms'])} the goal within "
                  f"{GOALS['latency_excess_ms']:g} ms."]
    lines += [f"- Note: {n}" for n in rec["settings"].get("notes") or []]
    return lines


# ---- the run ------------------------------------------------------------------------------------
def missing(kinds: list[str]) -> str | None:
    """Why this checkout cannot run the study, or None."""
    if not DRIVER.exists():
        return f"{DRIVER} missing: run scripts/build_cpp.sh"
    if "cpp-grpc" in kinds and not launch.CPP_BINARY.exists():
        return f"{launch.CPP_BINARY} missing: run scripts/build_cpp.sh"
    return None


def run(s: Settings, out: pathlib.Path, model: str, kinds: list[str]) -> dict:
    from rmscore_tools.host import machine_info

    vocab = int(json.loads((pathlib.Path(model) / "manifest.json").read_text())["vocab_size"])
    out.mkdir(parents=True, exist_ok=True)
    loadavg_start = os.getloadavg()
    wl = make_workload(s, vocab)
    say(f"workload: {wl['sequences']} sequences in {len(wl['sizes'])} full batches (sizes {wl['sizes']}), "
        f"{wl['dropped']} dropped; low-load request: {len(wl['small'])} sequences")
    batches_file = out / "batches.json"
    batches_file.write_text(json.dumps({"batches": wl["batches"], "probe": wl["small"]}))
    parity = run_parity(s, model)
    say(f"parity: max abs diff {parity['max_abs_diff']:.3g} vs {parity['reference']}")
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmpd:
        reps = [repetition(k, s, model, wl, batches_file, kinds, pathlib.Path(tmpd)) for k in range(s.repeats)]
    rec = {"format": "rmscore-bench-overhead/1",
           "meta": {**machine_info(), "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                    "loadavg_start": [round(x, 2) for x in loadavg_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()], "model": model},
           "settings": s.as_dict(), "kinds": kinds, "concurrency": concurrency(s), "goals": GOALS,
           "workload": {k: v for k, v in wl.items() if k not in ("batches", "small")},
           "parity": parity, "repetitions": reps}
    rec["summary"] = summarise(reps, kinds, s)
    write(rec, out)
    return rec


def write(rec: dict, out: pathlib.Path) -> str:
    (out / "overhead.json").write_text(json.dumps(rec, indent=1) + "\n")
    md = markdown(rec)
    (out / "overhead.md").write_text(md)
    return md
