"""`rmscore up`: the whole local stack without containers.

Every server kind on the default model, Prometheus (Debian's binary, the
project's own config with targets pointed here) scraping all of them, and the
Locust RLHF clients headless against all servers at once for a bounded time;
then a side-by-side table. Ctrl-C or SIGTERM stops everything it started, by PID.

The servers start through `rmscore.tools.launch.start`, like the tests' and the benchmark's, on
127.0.0.1 only, plaintext and without auth tokens (Locust and Prometheus here speak plain
loopback); TLS and tokens are for a real deployment (docs/contract.md, docs/deploy.md).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import yaml

from rmscore.tools import launch
from rmscore.tools.kinds import ALL_KINDS, KINDS

ROOT = launch.ROOT


# Rollouts in flight when the run time ends finish (up to this long) instead of counting as failures.
STOP_TIMEOUT_S = 60


class StackError(RuntimeError):
    pass


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: pathlib.Path


class Stack:
    def __init__(self, run_dir: pathlib.Path):
        self.run_dir = run_dir
        self.procs: list[Proc] = []

    def spawn(self, name: str, cmd: list[str]) -> Proc:
        log = self.run_dir / f"{name}.log"
        p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)
        proc = Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """SIGTERM each process we started (servers drain), then SIGKILL what is left."""
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        end = time.monotonic() + 40
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()


def prometheus_port(preferred: int = 9090) -> int:
    """9090 when free; else a free port (Debian's own prometheus.service may hold 9090)."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise StackError("no free port for Prometheus")


def wait_prometheus(proc: "Proc", port: int, timeout_s: float = 60) -> None:
    """Poll /-/ready, so the table never claims a Prometheus that did not start."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.popen.poll() is not None:
            break
        try:
            if httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    tail = proc.log.read_text(errors="replace")[-2000:] if proc.log.exists() else ""
    raise StackError(f"Prometheus did not become ready on 127.0.0.1:{port}:\n{tail}")


def prometheus_config(kinds: list[str], run_dir: pathlib.Path, scrape_seconds: int = 2,
                      port: int = 9090) -> pathlib.Path:
    """The compose stack's Prometheus config with its DNS discovery replaced by local targets."""
    cfg = yaml.safe_load((ROOT / "docker/prometheus/prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = f"{scrape_seconds}s"
    cfg["global"]["scrape_timeout"] = f"{scrape_seconds}s"
    cfg["global"]["evaluation_interval"] = f"{scrape_seconds}s"
    cfg["rule_files"] = [str(ROOT / "docker/prometheus/rules.yml")]
    for job in cfg["scrape_configs"]:
        if job["job_name"] == "rmscore":
            job.pop("dns_sd_configs", None)
            job.pop("relabel_configs", None)
            job["static_configs"] = [{"targets": [f"127.0.0.1:{KINDS[k].metrics_port}"], "labels": {"service": k}}
                                     for k in kinds]
        elif job["job_name"] == "prometheus":
            job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
    path = run_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_servers(stack: Stack, kinds: list[str], model: str, ready_timeout_s: float) -> None:
    started = []
    for kind in kinds:
        port = KINDS[kind].port
        flags = {"model": model, "intra_op_threads": 1, "inter_op_threads": 1}
        if KINDS[kind].transport == "grpc":
            flags["metrics_port"] = KINDS[kind].metrics_port
        print(f"[up] starting {kind} on 127.0.0.1:{port}", flush=True)
        try:
            server = launch.start(kind, port, wait_ready=False, ready_timeout_s=ready_timeout_s,
                                  log_dir=stack.run_dir / kind, **flags)
        except RuntimeError as e:
            raise StackError(f"{kind} failed to start (log {stack.run_dir / kind}):\n{e}") from None
        stack.procs.append(Proc(kind, server.proc, server.log_path))
        started.append(server)
    # All of them warm up at once: the slowest (torch.compile) sets the wait.
    deadline = time.monotonic() + ready_timeout_s
    for server in started:
        try:
            server.wait_until_ready(deadline)
        except RuntimeError as e:
            raise StackError(f"{server.kind} failed to start (log {server.log_path}):\n{e}") from None
        print(f"[up] {server.kind}: SERVING", flush=True)


def run_locust(stack: Stack, kinds: list[str], users_per_server: int, seconds: int) -> list[dict]:
    out = stack.run_dir / "locust.json"
    cmd = [str(pathlib.Path(sys.executable).with_name("locust")), "-f", str(ROOT / "loadtest/rlhf_client.py"),
           "--headless", "-u", str(users_per_server * len(kinds)), "-r", str(users_per_server * len(kinds)),
           "-t", f"{seconds}s", "--stop-timeout", str(STOP_TIMEOUT_S), "--json-file", str(out.with_suffix("")), "--only-summary",
           "--csv", str(stack.run_dir / "locust")]
    for kind in ALL_KINDS:
        k = KINDS[kind]
        cmd += ["--" + k.locust_option.replace("_", "-"), k.default_target if kind in kinds else "off"]
    print(f"[up] Locust: {users_per_server} trainer rank(s) per server for {seconds} s ...", flush=True)
    proc = stack.spawn("locust", cmd)
    try:
        proc.popen.wait(seconds + STOP_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        proc.popen.terminate()  # Locust stops at -t by itself; one that does not is hung
        raise StackError(f"Locust did not finish within {seconds + STOP_TIMEOUT_S + 60} s (log {proc.log}):\n"
                         f"{proc.log.read_text()[-3000:]}") from None
    if not out.exists():
        raise StackError(f"Locust wrote no results (log {proc.log}):\n{proc.log.read_text()[-3000:]}")
    return json.loads(out.read_text())


def _percentile(hist: dict, q: float) -> float:
    """Locust stores response times as {rounded_ms: count}."""
    items = sorted((float(k), v) for k, v in hist.items())
    total = sum(v for _, v in items)
    seen = 0
    for ms, v in items:
        seen += v
        if seen >= q * total:
            return ms
    return float("nan")


def table(stats: list[dict], kinds: list[str], seconds: float) -> str:
    """Throughput counts the sequences of successful RPCs over the whole run."""
    rows = ["| server | RPCs | sequences/s | RPC p50 ms | RPC p99 ms | rollout p50 ms | errors |",
            "|---|---|---|---|---|---|---|"]
    for kind in kinds:
        rpc = next((s for s in stats if s["name"] == f"{kind} Score"), None)
        roll = next((s for s in stats if s["name"] == f"{kind} rollout"), None)
        if rpc is None:
            rows.append(f"| {kind} | 0 | - | - | - | - | - |")
            continue
        ok = rpc["num_requests"] - rpc["num_failures"]
        per_rpc = rpc["total_content_length"] / max(1, rpc["num_requests"])
        rows.append(f"| {kind} | {rpc['num_requests']} | {ok * per_rpc / seconds:.1f} | "
                    f"{_percentile(rpc['response_times'], 0.5):.0f} | {_percentile(rpc['response_times'], 0.99):.0f} | "
                    f"{_percentile(roll['response_times'], 0.5) if roll else float('nan'):.0f} | "
                    f"{rpc['num_failures']} |")
    return "\n".join(rows)


def up(args) -> int:
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        print(f"rmscore up: error: --kinds: unknown {unknown}; choose from {list(ALL_KINDS)}")
        return 2
    if "cpp-grpc" in kinds and not launch.CPP_BINARY.exists():
        print(f"rmscore up: error: {launch.CPP_BINARY} is missing; run scripts/setup.sh")
        return 2
    run_dir = ROOT / "runs" / time.strftime("up-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True)
    stack = Stack(run_dir)
    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        start_servers(stack, kinds, args.model, args.ready_timeout_seconds)
        prom = shutil.which("prometheus")
        if prom:
            port = prometheus_port()
            proc = stack.spawn("prometheus", [prom, f"--config.file={prometheus_config(kinds, run_dir, port=port)}",
                                              f"--storage.tsdb.path={run_dir / 'tsdb'}",
                                              f"--web.listen-address=127.0.0.1:{port}"])
            wait_prometheus(proc, port)
            print(f"[up] Prometheus on http://127.0.0.1:{port} scraping every server", flush=True)
        else:
            print("[up] prometheus not installed (scripts/setup.sh installs it): metrics not collected")
        stats = run_locust(stack, kinds, args.users_per_server, args.duration_seconds)
        report = table(stats, kinds, args.duration_seconds)
        (run_dir / "summary.md").write_text(report + "\n")
        print("\n" + report + "\n", flush=True)
        print(f"[up] logs, Locust CSV/JSON and this table: {run_dir}")
        print("[up] endpoints: " + ", ".join(f"{k}=127.0.0.1:{KINDS[k].port}" for k in kinds))
        if args.keep_running:
            print("[up] --keep-running: Ctrl-C to stop everything", flush=True)
            while all(p.popen.poll() is None for p in stack.procs if p.name != "locust"):
                time.sleep(1)
        return 0
    except StackError as e:
        print(f"[up] FAILED: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("[up] interrupted", flush=True)
        return 130
    finally:
        print("[up] stopping everything it started ...", flush=True)
        stack.stop()


def add_parsers(sub) -> None:
    p = sub.add_parser("up", help="run the whole local stack: every server, Prometheus, Locust, a summary table",
                       description="Every server kind, Prometheus and Locust on 127.0.0.1, for a bounded run, then "
                                   "a summary table. The servers run on loopback without TLS and without auth "
                                   "tokens (--tls-cert-file/--auth-token-file are for a deployment, not this stack).")
    p.add_argument("--kinds", default=",".join(ALL_KINDS), help="server kinds to start (default: all)")
    p.add_argument("--model", default="models/default")
    p.add_argument("--duration-seconds", type=int, default=60, help="Locust run time (default: %(default)s)")
    p.add_argument("--users-per-server", type=int, default=2, help="trainer ranks per server (default: %(default)s)")
    p.add_argument("--ready-timeout-seconds", type=float, default=900,
                   help="time allowed for warm-up, torch.compile included (default: %(default)s)")
    p.add_argument("--keep-running", action="store_true", help="leave the stack up after the table, until Ctrl-C")
    p.set_defaults(func=up)
