"""rmscore against peer model-serving systems (Ray Serve, BentoML, NVIDIA PyTriton), same model, same machine,
same closed-loop workload: seq/s per system and concurrency, mean of R fresh server starts with a 95% t interval.

For each repetition (systems in list order on even repetitions, reversed on odd ones), for each system: start
a fresh server (a peer as a subprocess of its own venv's python, in a session of its own; an rmscore kind
through rmscore_tools.launch at its defaults), wait until it answers a real scoring request, warm up 2 s
(closed loop at the largest concurrency), then measure a closed loop at each concurrency C for W seconds
(rmscore_tools.loadgen.closed_loop: the window opens once every caller has had an answer and throughput is
counted answer to answer), then stop it (SIGTERM to the server, then SIGKILL to whatever of its session is
left). Requests: one sequence of token ids each, [101] + [2000 + j % 500 ...] + [102], lengths from
lognormal:96:0.6:16:256 (rmscore_tools.bench.scheduling.LENGTHS) drawn with numpy default_rng(--seed).

Peers are called over HTTP/JSON with aiohttp, one connection per concurrent caller (a pool of C
connections, C callers); rmscore kinds with rmscore's own asyncio client (caller.async_client, chunk_size=1:
gRPC over one HTTP/2 channel, or HTTP through httpx).

From the repository root, with rmscore's venv:

    .venv/bin/python docs/bench/peers_2026-12-07/peers.py --reps 3 --window-s 6
    .venv/bin/python docs/bench/peers_2026-12-07/peers.py --check          # correctness only, no load
    .venv/bin/python docs/bench/peers_2026-12-07/peers.py --systems ray,cpp-grpc --concurrency 1 --reps 1 --window-s 1

Ratio: for each C, rmscore's best kind (highest mean seq/s at that C) over the best peer (likewise): the
point is the ratio of the two means; the interval is the 95% t interval of the per-repetition ratios (both
measured in the same repetition), whose mean is printed too. Both "bests" are picked on the same data.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402

from rmscore_tools import caller, launch, loadgen  # noqa: E402
from rmscore_tools.bench.scheduling import LENGTHS  # noqa: E402
from rmscore_tools.host import machine_info  # noqa: E402
from rmscore_tools.stats import mean_ci  # noqa: E402
from rmscore_tools.workload import LengthMix  # noqa: E402

PEERS_VENV = pathlib.Path(os.environ.get("PEERS_VENV", "/tmp/peers/venv"))
PYTRITON_VENV = pathlib.Path(os.environ.get("PYTRITON_VENV", "/tmp/peers/venv-pytriton"))
PEERS_HOME = pathlib.Path(os.environ.get("PEERS_HOME", "/tmp/peers"))
MODEL = ROOT / "models" / "default" / "model.onnx"
RMSCORE_KINDS = ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime")
PEERS = ("ray", "bentoml", "pytriton")
DEFAULT_SYSTEMS = PEERS + RMSCORE_KINDS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sequence(length: int) -> list[int]:
    return [101] + [2000 + j % 500 for j in range(length - 2)] + [102]


def request_pool(seed: int, n: int) -> list[list[list[int]]]:
    """n requests of one sequence each, lengths from the neutral driver's mix."""
    lens = LengthMix.parse(LENGTHS).sample(np.random.default_rng(seed), n)
    return [[sequence(int(L))] for L in lens]


# ---- peers: how each is started and called ------------------------------------------------------

@dataclass
class PeerSpec:
    name: str
    python: pathlib.Path
    argv: list[str]  # after the python; {port} {port2} {port3} filled in
    path: str  # the scoring URL path
    encode: callable  # one sequence -> JSON body (dict)
    decode: callable  # the JSON answer -> score
    env: dict = field(default_factory=dict)


PAD_TO = LengthMix.parse(LENGTHS).max_len  # PyTriton: Triton batches equal shapes only (serve_pytriton.py)


def _triton_body(seq: list[int]) -> dict:
    n = len(seq)
    return {"inputs": [
        {"name": "input_ids", "shape": [1, PAD_TO], "datatype": "INT64", "data": seq + [0] * (PAD_TO - n)},
        {"name": "attention_mask", "shape": [1, PAD_TO], "datatype": "INT64", "data": [1] * n + [0] * (PAD_TO - n)},
    ]}


SPECS = {
    "ray": PeerSpec("ray", PEERS_VENV / "bin" / "python", [str(HERE / "serve_ray.py"), "--port", "{port}"],
                    "/", lambda s: {"ids": s}, lambda j: j["score"],
                    {"RAY_USAGE_STATS_ENABLED": "0"}),
    "bentoml": PeerSpec("bentoml", PEERS_VENV / "bin" / "python",
                        ["-m", "bentoml", "serve", "serve_bento:Scorer", "--host", "127.0.0.1", "--port", "{port}"],
                        "/score", lambda s: {"ids": [s]}, lambda j: j[0],
                        {"BENTOML_DO_NOT_TRACK": "True", "BENTOML_HOME": str(PEERS_HOME / "bentoml_home")}),
    "pytriton": PeerSpec("pytriton", PYTRITON_VENV / "bin" / "python",
                         [str(HERE / "serve_pytriton.py"), "--http-port", "{port}", "--grpc-port", "{port2}",
                          "--metrics-port", "{port3}"],
                         "/v2/models/reward/infer", _triton_body, lambda j: j["outputs"][0]["data"][0],
                         {"PYTRITON_HOME": str(PEERS_HOME / "pytriton_home")}),
}


class PeerServer:
    """A peer's server process, the leader of a session of its own: only it and its descendants are signalled."""

    def __init__(self, spec: PeerSpec, log_dir: pathlib.Path):
        self.spec = spec
        self.port, port2, port3 = free_port(), free_port(), free_port()
        argv = [a.format(port=self.port, port2=port2, port3=port3) for a in spec.argv]
        self.log_path = log_dir / f"{spec.name}-{time.strftime('%H%M%S')}-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env.update(PYTHONUNBUFFERED="1", PATH=f"{spec.python.parent}:{env.get('PATH', '')}", **spec.env)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([str(spec.python), *argv], cwd=HERE, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}{spec.path}"

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def session_pids(self) -> list[int]:
        """Processes in this server's session (its session id is the leader's PID), leader included."""
        pids = []
        for d in pathlib.Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
            if int(fields[3]) == self.proc.pid and fields[0] != "Z":
                pids.append(int(d.name))
        # Once the leader is reaped its PID may be reused (and a process that takes it and calls setsid gets
        # that session id): from then on only the other members, which can only be the leader's descendants.
        if self.proc.returncode is not None:
            pids = [p for p in pids if p != self.proc.pid]
        return pids

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the leader shuts its framework down (serve_*.py)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = self.session_pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            while self.session_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            deadline = time.monotonic() + 5
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class PeerClient:
    """loadgen's client interface (`await score_ids(seqs, on_chunk=None)` -> .scores) over aiohttp: one
    request per sequence, at most `connections` connections (one per concurrent caller). Bodies are encoded
    once per pool entry and system, and reused by every later phase."""

    _bodies: dict[tuple[str, int], tuple[list, bytes]] = {}  # shared by the instances

    def __init__(self, spec: PeerSpec, url: str, connections: int, timeout_s: float = 120):
        self.spec, self.url = spec, url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections, force_close=False),
            timeout=aiohttp.ClientTimeout(total=timeout_s))

    def body(self, seq: list[int]) -> bytes:
        key = (self.spec.name, id(seq))
        hit = self._bodies.get(key)
        if hit is None or hit[0] is not seq:
            hit = (seq, json.dumps(self.spec.encode(seq)).encode())
            self._bodies[key] = hit
        return hit[1]

    async def score_ids(self, seqs, on_chunk=None):
        scores = []
        for seq in seqs:
            async with self.session.post(self.url, data=self.body(seq),
                                         headers={"content-type": "application/json"}) as r:
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
                scores.append(float(self.spec.decode(await r.json(content_type=None))))
        return SimpleNamespace(scores=scores)

    async def close(self):
        await self.session.close()


# ---- one system: start, ready, measure, stop ---------------------------------------------------

class System:
    def __init__(self, name: str, log_dir: pathlib.Path):
        self.name, self.log_dir = name, log_dir
        self.server = None

    def start(self, ready_timeout_s: float) -> float:
        t0 = time.monotonic()
        if self.name in SPECS:
            self.server = PeerServer(SPECS[self.name], self.log_dir)
            asyncio.run(self._wait_peer(ready_timeout_s))
        else:
            self.server = launch.start(self.name, ready_timeout_s=ready_timeout_s, log_dir=tempfile.mkdtemp(
                prefix=f"{self.name}-", dir=self.log_dir))
        return time.monotonic() - t0

    async def _wait_peer(self, timeout_s: float) -> None:
        spec, s = SPECS[self.name], self.server
        deadline = time.monotonic() + timeout_s
        probe = json.dumps(spec.encode(sequence(8))).encode()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                if s.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {s.proc.returncode}:\n{s.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer in {timeout_s} s:\n{s.log_tail()}")
                try:
                    async with http.post(s.url, data=probe, headers={"content-type": "application/json"}) as r:
                        if r.status == 200 and math.isfinite(float(spec.decode(await r.json(content_type=None)))):
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError, IndexError):
                    pass
                await asyncio.sleep(0.5)

    def client(self, connections: int):
        if self.name in SPECS:
            return PeerClient(SPECS[self.name], self.server.url, connections)
        return caller.async_client(launch.transport(self.name), caller.target_of(self.server), chunk_size=1,
                                   timeout_s=120)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(30)
            self.server = None

    def log_path(self) -> str:
        return str(self.server.log_path) if self.server is not None else ""


async def measure(system: System, pool, concurrencies, window_s: float, warmup_s: float) -> dict:
    out = {}
    c = system.client(max(concurrencies))
    try:
        w = await loadgen.warmup(c, pool, max(concurrencies), warmup_s)
    finally:
        await c.close()
    out["warmup"] = w
    for conc in concurrencies:
        c = system.client(conc)  # fresh connections per phase
        try:
            r = await loadgen.closed_loop(c, pool, conc, window_s, max_settle_s=120)
        finally:
            await c.close()
        r.pop("latencies_ms", None)
        out[conc] = r
        lat = r["latency_ms"]
        print(f"      C={conc:<3d} {r['throughput_seq_s']:8.1f} seq/s  p50 {lat.get('p50', math.nan):7.1f} ms"
              f"  p99 {lat.get('p99', math.nan):7.1f} ms  errors {r['errors']}"
              f"{' ' + str(r['error_kinds']) if r['errors'] else ''}", flush=True)
    return out


# ---- correctness check ---------------------------------------------------------------------------

def check(systems, log_dir, ready_timeout_s) -> bool:
    """Each system alone: a few sequences (lengths 2..256) at concurrency <= 4, scores finite and within
    1e-4 of onnxruntime run directly (batch of one, no padding) on the same ids."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(MODEL), so, providers=["CPUExecutionProvider"])
    lens = [2, 16, 37, 96, 97, 128, 200, 256]
    seqs = [sequence(L) for L in lens]
    ref = [float(sess.run(["scores"], {"input_ids": np.array([s], np.int64),
                                        "attention_mask": np.ones((1, len(s)), np.int64)})[0][0]) for s in seqs]
    ok_all = True
    for name in systems:
        sysm = System(name, log_dir)
        try:
            t = sysm.start(ready_timeout_s)

            async def run():
                c = sysm.client(4)
                sem = asyncio.Semaphore(4)

                async def one(s):
                    async with sem:
                        return (await c.score_ids([s])).scores[0]
                try:
                    t0 = time.monotonic()
                    got = await asyncio.gather(*[one(s) for s in seqs + seqs])  # 16 requests, 4 at a time
                    return got, time.monotonic() - t0
                finally:
                    await c.close()
            got, secs = asyncio.run(run())
            diffs = [abs(g - r) for g, r in zip(got, ref + ref)]
            ok = all(math.isfinite(g) for g in got) and max(diffs) <= 1e-4
            ok_all &= ok
            print(f"{name}: {'OK' if ok else 'FAIL'} ready in {t:.1f} s; {len(got)} requests in {secs:.2f} s at "
                  f"<= 4 in flight; max |score - onnxruntime| = {max(diffs):.2e}; "
                  f"scores {[round(g, 5) for g in got[:len(seqs)]]}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            ok_all = False
            print(f"{name}: FAIL {e}", flush=True)
        finally:
            sysm.stop()
    print("reference (onnxruntime direct):", [round(r, 5) for r in ref])
    return ok_all


# ---- summary ---------------------------------------------------------------------------------------

def versions() -> dict:
    def pkgs(python, names):
        code = ("import importlib.metadata as m, json, sys; out = {}\n"
                "for n in sys.argv[1:]:\n    try: out[n] = m.version(n)\n    except Exception: out[n] = None\n"
                "print(json.dumps(out))")
        try:
            return json.loads(subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True,
                                             timeout=60).stdout)
        except Exception as e:  # noqa: BLE001
            return {"error": str(e)}
    import onnxruntime

    return {"peers_venv": pkgs(PEERS_VENV / "bin" / "python", ["ray", "bentoml", "onnxruntime", "numpy", "uvicorn"]),
            "pytriton_venv": pkgs(PYTRITON_VENV / "bin" / "python", ["nvidia-pytriton", "onnxruntime", "numpy"]),
            "rmscore_venv": {"onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
                             "aiohttp": aiohttp.__version__}}


def summarise(raw: dict, systems, concurrencies, reps) -> dict:
    """raw[system][rep][C] = seq/s (nan when that start failed)."""
    table = {}
    for s in systems:
        table[s] = {}
        for c in concurrencies:
            vals = [raw[s][r].get(c, float("nan")) for r in range(reps)]
            ci = mean_ci(vals)
            table[s][c] = {"values": vals, "mean": ci.mean, "half_width": ci.half_width, "lo": ci.lo, "hi": ci.hi,
                           "n": ci.n, "fmt": ci.fmt()}
    ratios = {}
    kinds = [s for s in systems if s in RMSCORE_KINDS]
    peers = [s for s in systems if s in SPECS]
    for c in concurrencies:
        def best(group):
            good = [s for s in group if table[s][c]["n"] > 0]
            return max(good, key=lambda s: table[s][c]["mean"]) if good else None
        k, p = best(kinds), best(peers)
        if k is None or p is None:
            continue
        per_rep = [raw[k][r].get(c, float("nan")) / raw[p][r].get(c, float("nan")) for r in range(reps)]
        ci = mean_ci(per_rep)
        ratios[c] = {"rmscore_best": k, "peer_best": p,
                     "ratio_of_means": table[k][c]["mean"] / table[p][c]["mean"],
                     "per_rep_ratios": per_rep, "mean_of_per_rep_ratios": ci.mean,
                     "ci95": [ci.lo, ci.hi], "half_width": ci.half_width, "n": ci.n,
                     "interval": "95% t interval of the per-repetition ratios (best kind / best peer, same repetition)"}
    return {"table": table, "ratios": ratios}


def print_summary(summary, systems, concurrencies, reps, window_s, cpu) -> None:
    print(f"\nseq/s, mean ± 95% half-width (t, {reps} fresh starts each; closed loop, {window_s:g} s windows, "
          f"lengths {LENGTHS}); CPU: {cpu}, {os.cpu_count()} logical CPUs")
    w = max(len(s) for s in systems) + 2
    print("system".ljust(w) + "".join(f"C={c}".rjust(18) for c in concurrencies))
    for s in systems:
        print(s.ljust(w) + "".join(summary["table"][s][c]["fmt"].rjust(18) for c in concurrencies))
    for c, r in summary["ratios"].items():
        lo, hi = r["ci95"]
        print(f"C={c}: rmscore best ({r['rmscore_best']}) / best peer ({r['peer_best']}): ratio of means "
              f"{r['ratio_of_means']:.2f}; per-repetition ratios {r['mean_of_per_rep_ratios']:.2f} "
              f"[{lo:.2f}, {hi:.2f}] (95% t, n={r['n']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated, from {', '.join(DEFAULT_SYSTEMS)} (default: all)")
    ap.add_argument("--concurrency", default="1,8,64", help="comma-separated closed-loop concurrencies")
    ap.add_argument("--reps", type=int, default=3, help="fresh server starts per system")
    ap.add_argument("--window-s", type=float, default=6.0, help="measurement window per concurrency")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=20261207)
    ap.add_argument("--pool", type=int, default=4096, help="distinct requests the callers cycle through")
    ap.add_argument("--ready-timeout-s", type=float, default=400)
    ap.add_argument("--out", default=str(HERE / "peers_results.json"))
    ap.add_argument("--rmscore-cache-dir", default=None,
                    help="RMSCORE_CACHE_DIR for the rmscore kinds (their cost-profile cache). Default: a fresh "
                         "folder of this run, so the run's first rmscore start measures the table on this machine "
                         "and later starts load it (rmscore's default behaviour), whatever ~/.cache holds; "
                         "'user': leave RMSCORE_CACHE_DIR as it is (~/.cache/rmscore unless set)")
    ap.add_argument("--check", action="store_true", help="correctness check only (no load), then exit")
    a = ap.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in DEFAULT_SYSTEMS]
    if bad:
        ap.error(f"unknown systems {bad}; choose from {', '.join(DEFAULT_SYSTEMS)}")
    concurrencies = [int(x) for x in a.concurrency.split(",") if x.strip()]
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="peers-logs-", dir=PEERS_HOME if PEERS_HOME.is_dir() else None))
    if a.rmscore_cache_dir != "user":
        os.environ["RMSCORE_CACHE_DIR"] = a.rmscore_cache_dir or str(log_dir / "rmscore-cache")
    cpu = machine_info()["cpu"]
    print(f"RMSCORE_CACHE_DIR={os.environ.get('RMSCORE_CACHE_DIR', '(unset: ~/.cache/rmscore)')}", flush=True)
    print(f"CPU: {cpu} ({os.cpu_count()} logical CPUs); load average {os.getloadavg()}; logs in {log_dir}", flush=True)
    if a.check:
        return 0 if check(systems, log_dir, a.ready_timeout_s) else 1

    pool = request_pool(a.seed, a.pool)
    lens = [len(r[0]) for r in pool]
    print(f"{len(pool)} requests, lengths median {statistics.median(lens):g}, mean {statistics.mean(lens):.1f}, "
          f"min {min(lens)}, max {max(lens)}; systems {systems}; C {concurrencies}; {a.reps} reps x {a.window_s:g} s",
          flush=True)
    raw = {s: [{} for _ in range(a.reps)] for s in systems}
    runs = []
    t_all = time.monotonic()
    for rep in range(a.reps):
        order = systems if rep % 2 == 0 else systems[::-1]
        for name in order:
            print(f"[rep {rep + 1}/{a.reps}] {name}: starting (load average {os.getloadavg()[0]:.2f})", flush=True)
            sysm = System(name, log_dir)
            rec = {"system": name, "rep": rep}
            try:
                rec["ready_s"] = round(sysm.start(a.ready_timeout_s), 2)
                rec["log"] = sysm.log_path()
                print(f"    ready in {rec['ready_s']} s; warm-up {a.warmup_s:g} s at C={max(concurrencies)}",
                      flush=True)
                res = asyncio.run(measure(sysm, pool, concurrencies, a.window_s, a.warmup_s))
                rec["warmup"] = res.pop("warmup")
                rec["phases"] = {str(c): r for c, r in res.items()}
                for c, r in res.items():
                    # A phase with errors is not a throughput of this system: recorded, left out of the means.
                    raw[name][rep][c] = r["throughput_seq_s"] if r["errors"] == 0 else float("nan")
            except Exception as e:  # noqa: BLE001 - one failed start must not end the study
                rec["error"] = f"{type(e).__name__}: {e}"[:4000]
                print(f"    FAILED: {rec['error'][:2000]}", flush=True)
            finally:
                sysm.stop()
            runs.append(rec)
            time.sleep(1.0)
    summary = summarise(raw, systems, concurrencies, a.reps)
    print_summary(summary, systems, concurrencies, a.reps, a.window_s, cpu)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    out = {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(), "rmscore_commit": commit,
           "versions": versions(), "lengths": LENGTHS, "seed": a.seed, "pool": a.pool, "reps": a.reps,
           "window_s": a.window_s, "warmup_s": a.warmup_s, "concurrency": concurrencies, "systems": systems,
           "pytriton_client_pad_to": PAD_TO, "rmscore_cache_dir": os.environ.get("RMSCORE_CACHE_DIR"),
           "elapsed_s": round(time.monotonic() - t_all, 1),
           "summary": {"table": {s: {str(c): v for c, v in t.items()} for s, t in summary["table"].items()},
                       "ratios": {str(c): v for c, v in summary["ratios"].items()}},
           "runs": runs}
    pathlib.Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.out} ({out['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
