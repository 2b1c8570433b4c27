"""`rmscore up`: which runtime is fastest here, measured, then the whole local stack to look at.

Every server kind on the default model (through `rmscore_tools.launch`, the one launcher), and
Prometheus (Debian's binary, the project's config with targets pointed here) scraping all of them.

1. Each server alone (alone.py): a short closed-loop ramp finds its capacity, then repeated
   short windows at the concurrency that carries it give throughput, p50 and p99 with 95%
   intervals; the ranking shows each as a ratio to the fastest. Every server is spawned at once
   (phase 2 needs them all, and starting torch.compile twice would cost minutes); on a machine
   with CPU to spare each is measured as soon as it is SERVING, while later ones still warm up
   (start.py; on a busy one, after all are SERVING): during a
   measurement every other process `up` started runs at nice 19, so a torch.compile warm-up only
   takes CPU time the measured server leaves idle, and the run reads the others' CPU time
   (/proc) over each measurement to show it (beside the ranking). `--no-overlap` waits for
   every server first. An idle server only waits on a condition variable.
2. All at once: the Locust RLHF users (loadtest/rlhf_client.py), one trainer rank per server,
   each offered `utilization` x its measured capacity / servers (sizing.contended_offers),
   so queues stay bounded and latencies mean something; each server's share of what was scored,
   and the rollout makespan a trainer rank waits for.
3. The page (report.py): plots, the dashboards' own PromQL run against this run's Prometheus,
   the settings; written to runs/up-<time>/index.html.

Every server runs with its kind's defaults (threads, batching, model workers): what a user who
starts one gets, so the ranking is of the product, not of a configuration only `up` uses. Sizes
follow the machine: the ramp stops where a server saturates, windows hold enough answers at that server's rate, and phase 2's load
follows the capacities. `--keep-running` leaves servers, Prometheus and a Locust web UI up.
Ctrl-C or SIGTERM stops everything it started, by PID. A server that fails to start or its
self-check, or exits later, is reported by name with the end of its log, as a failed row in the
table and on the page; the others still run, and the exit status is then 3 (EXIT_SOME_FAILED;
1: nothing could be measured, 2: bad arguments, 130: interrupted). The last line is the wall
time with its breakdown by phase. Servers listen on 127.0.0.1 only, plaintext and without tokens
(TLS and tokens are for a deployment: docs/contract.md, docs/deploy.md); a kind's usual port that
is taken is replaced by a free one.
"""

from __future__ import annotations

import json
import os
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

from rmscore_tools import launch, observe
from rmscore_tools.kinds import ALL_KINDS, KINDS
# Named up_*: `alone`, `start` and `report` are also local names here.
from rmscore_tools.up import alone as up_alone, report as up_report, sizing as up_sizing, start as up_start
from rmscore_tools.stats import percentiles

ROOT = launch.ROOT

# Rollouts in flight when phase 2 ends finish (up to this long) instead of counting as failures.
STOP_TIMEOUT_S = 30
SCRAPE_S = 2


# Some kinds failed (reported by name in the table, the page and the last line); the others are ranked.
EXIT_SOME_FAILED = 3


class StackError(RuntimeError):
    pass


class Clock:
    """When each phase ended, since the start: the breakdown printed last and kept in result.json."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.phases: list[dict] = []

    def mark(self, phase: str, note: str = "") -> None:
        at = time.monotonic() - self.t0
        since = at - (self.phases[-1]["at_s"] if self.phases else 0.0)
        self.phases.append({"phase": phase, "at_s": round(at, 1), "took_s": round(since, 1), "note": note})

    def breakdown(self) -> str:
        return "; ".join(f"{p['phase']} {p['took_s']:.0f} s" + (f" ({p['note']})" if p["note"] else "")
                         for p in self.phases)


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
        with open(log, "w") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
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
        # A server still starting when up stopped is not in self.procs yet (its launch thread
        # has not returned): every process left below this one is ours, and goes too.
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            left = live_descendants()
            for pid in left:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            end = time.monotonic() + wait_s
            while left and time.monotonic() < end:
                time.sleep(0.1)
                left = live_descendants()


def live_descendants() -> list[int]:
    """The processes below this one that have not exited (zombies are gone, only not yet reaped)."""
    out = []
    for pid in observe.descendants(os.getpid()):
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


def free_port(preferred: int) -> int:
    """`preferred` when free, else an ephemeral free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise StackError(f"no free port on 127.0.0.1 (asked for {preferred})")


def prometheus_port(preferred: int = 9090) -> int:
    """9090 when free; else a free port (Debian's own prometheus.service may hold 9090)."""
    return free_port(preferred)


def wait_http(proc: Proc, url: str, what: str, timeout_s: float = 60) -> None:
    """Poll `url` until 200, so nothing claims a Prometheus or Locust UI that did not start."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.popen.poll() is None:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    tail = proc.log.read_text(errors="replace")[-2000:] if proc.log.exists() else ""
    raise StackError(f"{what} did not become ready at {url} (exit {proc.popen.poll()}):\n{tail}")


def prometheus_config(servers: dict, run_dir: pathlib.Path, scrape_seconds: int = SCRAPE_S,
                      port: int = 9090) -> pathlib.Path:
    """The compose stack's Prometheus config with its DNS discovery replaced by local targets;
    `servers` maps kind to its metrics port. Each target is labelled service=<kind>."""
    cfg = yaml.safe_load((ROOT / "docker/prometheus/prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = f"{scrape_seconds}s"
    cfg["global"]["scrape_timeout"] = f"{scrape_seconds}s"
    cfg["global"]["evaluation_interval"] = f"{scrape_seconds}s"
    cfg["rule_files"] = [str(ROOT / "docker/prometheus/rules.yml")]
    for job in cfg["scrape_configs"]:
        if job["job_name"] == "rmscore":
            job.pop("dns_sd_configs", None)
            job.pop("relabel_configs", None)
            job["static_configs"] = [{"targets": [f"127.0.0.1:{mport}"], "labels": {"service": k}}
                                     for k, mport in servers.items()]
        elif job["job_name"] == "prometheus":
            job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
    path = run_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class Progress:
    """Which phase, which server, and an estimate of the time left, on every line."""

    def __init__(self, plan_s: float):
        self.t0, self.wall_start = time.monotonic(), time.time()
        self.plan_end = self.t0 + plan_s
        self.where = "start"

    def replan(self, left_s: float) -> None:
        self.plan_end = time.monotonic() + left_s

    def __call__(self, msg: str) -> None:
        left = max(0, self.plan_end - time.monotonic())
        print(f"[up {time.monotonic() - self.t0:4.0f}s | {self.where} | ~{left:.0f}s left] {msg}", flush=True)


def start_prometheus(stack: Stack, servers: dict, say) -> str | None:
    """Prometheus scraping every started server; its base URL, or None where it is not installed."""
    prom = shutil.which("prometheus")
    if not prom:
        say("prometheus not installed (scripts/setup.sh installs it): no metrics, no dashboard panels")
        return None
    port = prometheus_port()
    cfg = prometheus_config({k: s.metrics_port for k, s in servers.items()}, stack.run_dir, port=port)
    proc = stack.spawn("prometheus", [prom, f"--config.file={cfg}", f"--storage.tsdb.path={stack.run_dir / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{port}"])
    base = f"http://127.0.0.1:{port}"
    wait_http(proc, f"{base}/-/ready", "Prometheus")
    say(f"Prometheus on {base}, scraping every {SCRAPE_S} s")
    return base


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and its descendants (0 for one gone meanwhile)."""
    total = 0.0
    for p in [pid, *observe.descendants(pid)]:
        try:
            total += observe.cpu_s(p)
        except OSError:
            continue
    return total


def alone_settings(args) -> dict:
    return {"warmup_s": args.warmup_seconds, "max_concurrency": args.max_concurrency,
            "ramp_window_s": args.ramp_window_seconds, "window_s": args.window_seconds, "windows": args.windows}


def measure_one(kind: str, server, starting: up_start.Starting, args, progress: Progress, failed: dict) -> dict | None:
    """One server alone, every other process `up` started at the lowest priority meanwhile; its
    figures plus the CPU the others used, or None (reported in `failed`) when it failed."""
    if server.proc.poll() is not None:
        failed[kind] = f"exited with {server.proc.returncode} before its measurement:\n{server.log()[-1500:]}"
        progress(f"FAILED: {failed[kind]}")
        return None
    t = time.monotonic()
    others = {k: s.proc.pid for k, s in starting.bound().items() if k != kind}
    warming = set(starting.warming)
    before = {k: cpu_seconds(p) for k, p in others.items()}
    if starting.overlap:
        up_start.favour(server.proc.pid)
    try:
        m = up_alone.measure(server.transport, server.target if server.transport == "grpc" else server.base_url,
                             alone_settings(args), progress)
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server exited with {server.proc.returncode} during its measurement")
    except Exception as e:  # noqa: BLE001 - one server's failure must not stop the others' measurement
        tail = server.log()[-1500:]
        failed[kind] = f"failed while measured alone: {e!r}\n{tail}"
        progress(f"FAILED: {e!r}; end of its log:\n{tail}")
        return None
    finally:
        if starting.overlap:
            up_start.favour(None)
    took = time.monotonic() - t
    used = {k: (cpu_seconds(p) - before[k]) / took for k, p in others.items()}
    m["others_cpu_share"] = sum(v for k, v in used.items() if k not in warming)
    m["warming_cpu_share"] = sum(v for k, v in used.items() if k in warming)
    m["measured_s"] = took
    progress(f"{m['throughput']['mean']:.1f} seq/s at C={m['concurrency']}, p50 {m['p50_ms']['mean']:.0f} ms, "
             f"p99 {m['p99_ms']['mean']:.0f} ms; idle servers used {m['others_cpu_share']:.0%} of a core"
             + (f", servers warming up at nice 19 {m['warming_cpu_share']:.0%}" if warming else ""))
    return m


def phase_alone(stack: Stack, starting: up_start.Starting, args, progress: Progress, clock: Clock) -> tuple:
    """Each server measured alone as soon as it is SERVING (the first ready first, in kind order),
    while later ones still warm up; Prometheus starts once every server has bound its ports.
    ({kind: figures}, Prometheus URL or None)."""
    results, prom, waited, last_say = {}, None, 0.0, 0.0
    failed = starting.failed
    while True:
        starting.poll()
        if prom is None and starting.all_bound() and starting.bound():
            prom = start_prometheus(stack, starting.bound(), progress)
            clock.mark("all servers bound, Prometheus up")
        todo = [k for k in starting.ready if k not in results and k not in failed]
        if starting.done() and not todo:
            break
        if not todo or not (starting.overlap or starting.done()):
            t = time.monotonic()
            starting.wait(0.5)
            waited += time.monotonic() - t
            if time.monotonic() - last_say >= 10:
                last_say = time.monotonic()
                progress(f"waiting for {', '.join([*starting.spawning, *starting.warming])} to start and warm "
                         f"up ({time.monotonic() - starting.t0:.0f} s so far)")
            continue
        kind = todo[0]
        total = len(starting.ready) + len(starting.warming) + len(starting.spawning)
        progress.where = f"1/3 alone {len(results) + 1}/{total} {kind}"
        m = measure_one(kind, starting.ready[kind], starting, args, progress, failed)
        if m is not None:
            results[kind] = m
            per_kind = sum(x["measured_s"] for x in results.values()) / len(results)
            left = len(starting.warming) + len(starting.spawning) + len(todo) - 1
            progress.replan(per_kind * left + args.duration_seconds + STOP_TIMEOUT_S / 2 + 20)
    clock.mark("alone phase", f"{waited:.0f} s of it waiting for warm-ups; SERVING after " + ", ".join(
        f"{k} {v:.0f} s" for k, v in starting.ready_s.items()))
    return results, prom


def locust_command(servers: dict, offers: dict, extra: list[str]) -> list[str]:
    """Locust on rlhf_client.py: one user per offered server, one-sequence RPCs, each kind paced
    at its sized rollout period; kinds not offered are off."""
    size = next(iter(offers.values())).rollout_size
    cmd = [str(pathlib.Path(sys.executable).with_name("locust")), "-f", str(ROOT / "loadtest/rlhf_client.py"),
           "-u", str(len(offers)), "-r", str(len(offers)), "--rollout-size", str(size), "--chunk-size", "1",
           "--rollout-period", ",".join(f"{k}={o.period_s:.3f}" for k, o in offers.items())]
    for kind in ALL_KINDS:
        k, s = KINDS[kind], servers.get(kind)
        target = "off" if kind not in offers else (s.target if s.transport == "grpc" else s.base_url)
        cmd += ["--" + k.locust_option.replace("_", "-"), target]
    return cmd + extra


def run_locust(stack: Stack, servers: dict, offers: dict, seconds: int, progress: Progress) -> list[dict]:
    out = stack.run_dir / "locust"
    cmd = locust_command(servers, offers, ["--headless", "-t", f"{seconds}s", "--stop-timeout", str(STOP_TIMEOUT_S),
                                           "--json-file", str(out), "--csv", str(out), "--only-summary"])
    proc = stack.spawn("locust", cmd)
    start, limit = time.monotonic(), seconds + STOP_TIMEOUT_S + 60
    while proc.popen.poll() is None:
        elapsed = time.monotonic() - start
        if elapsed > limit:
            proc.popen.terminate()  # Locust stops at -t by itself; one that does not is hung
            raise StackError(f"Locust did not finish within {limit} s (log {proc.log}):\n{proc.log.read_text()[-3000:]}")
        progress(f"Locust RLHF users on {len(offers)} servers: {min(elapsed, seconds):.0f}/{seconds} s")
        time.sleep(min(10.0, max(1.0, seconds / 6)))
    if not out.with_suffix(".json").exists():
        raise StackError(f"Locust wrote no results (exit {proc.popen.returncode}, log {proc.log}):\n"
                         f"{proc.log.read_text()[-3000:]}")
    return json.loads(out.with_suffix(".json").read_text())


def _ms_percentile(hist: dict, q: float) -> float:
    """Locust stores response times as {rounded_ms: count}."""
    return percentiles([float(ms) for ms, n in hist.items() for _ in range(n)], (q,))[f"p{q:g}"]


def contended_rows(stats: list[dict], offers: dict, seconds: float) -> list[dict]:
    """Per server from Locust's JSON: offered and scored sequences/s, its share of everything
    scored, and the rollout makespan (first send to last score of a rollout)."""
    by_name = {s["name"]: s for s in stats}
    rows = []
    for kind, o in offers.items():
        rpc, roll = by_name.get(f"{kind} Score"), by_name.get(f"{kind} rollout")
        ok_rollouts = (roll["num_requests"] - roll["num_failures"]) if roll else 0
        scored = (ok_rollouts * o.rollout_size) / seconds
        rows.append({"kind": kind, "offered_seq_s": o.rate_seq_s, "scored_seq_s": scored, "rollouts": ok_rollouts,
                     "makespan_p50_s": _ms_percentile(roll["response_times"], 50) / 1e3 if roll else float("nan"),
                     "makespan_p99_s": _ms_percentile(roll["response_times"], 99) / 1e3 if roll else float("nan"),
                     "rpc_p99_ms": _ms_percentile(rpc["response_times"], 99) if rpc else float("nan"),
                     "errors": (rpc["num_failures"] if rpc else 0) + (roll["num_failures"] if roll else 0)})
    total = sum(r["scored_seq_s"] for r in rows) or float("nan")
    for r in rows:
        r["share"] = r["scored_seq_s"] / total
    return rows


def settings_of(args, kinds: list[str]) -> dict:
    from rmscore.core.config import ServeConfig
    from rmscore_tools.host import machine_info

    d, m = ServeConfig(model=pathlib.Path(args.model)), machine_info()
    return {"cores": os.cpu_count(), "cpu": m["cpu"], "platform": m["platform"], "commit": m["commit"][:12],
            "kinds": ", ".join(kinds), "model": args.model,
            "intra-op threads per server": f"{d.intra_op_threads} (the default)",
            "inter-op threads": d.inter_op_threads, "model workers": {-1: "elastic", 0: "auto"}.get(d.model_workers, d.model_workers), "batching": d.batching, "max batch size": d.max_batch_size,
            "max batch tokens": d.max_batch_tokens, "max queue delay ms": d.max_queue_delay_ms,
            "max queue sequences": d.max_queue_sequences,
            "workload": f"one sequence per request, {up_alone.WORKLOAD.mix.describe()}",
            "alone: ramp window s": args.ramp_window_seconds, "alone: max concurrency": args.max_concurrency,
            "alone: windows": args.windows, "alone: window s": args.window_seconds or "sized per server",
            "all at once: seconds": args.duration_seconds, "all at once: utilization": args.utilization,
            "Prometheus scrape s": SCRAPE_S}


def phase_contended(stack: Stack, servers: dict, alone: dict, args, progress: Progress) -> dict:
    """Phase 2: Locust against every measured server at once, sized from phase 1."""
    progress.where = "2/3 all at once"
    offers = up_sizing.contended_offers({k: alone[k]["throughput"]["mean"] for k in alone}, args.duration_seconds,
                                        args.utilization)
    for o in offers.values():
        progress(f"{o.kind}: offered {o.rate_seq_s:.1f} seq/s ({o.utilization:.0%} of its capacity alone), "
                 f"a rollout of {o.rollout_size} every {o.period_s:.1f} s")
    start = time.time()
    stats = run_locust(stack, servers, offers, args.duration_seconds, progress)
    end = start + args.duration_seconds
    rows = contended_rows(stats, offers, args.duration_seconds)
    return {"offers": {k: vars(o) for k, o in offers.items()}, "rows": rows, "start": start, "end": end,
            "md": up_report.contended_markdown(rows)}


def write_report(run_dir: pathlib.Path, r: dict, alone: dict, prom: str | None, progress: Progress) -> pathlib.Path:
    """Plots, Prometheus read back (query_range and the dashboards' panels), result.json, index.html."""
    progress.where = "3/3 report"
    c = r.get("contended")
    series = None
    if prom and c:
        series = up_report.contended_series(prom, c["start"], c["end"], SCRAPE_S)
        r["panels"] = up_report.panel_values(prom, ROOT, c["end"])
    images = up_report.plots(r["ranking"], alone, series, run_dir)
    (run_dir / "result.json").write_text(json.dumps(
        {**r, "alone": {k: {x: v for x, v in m.items() if x != "latencies_ms"} for k, m in alone.items()}},
        indent=1, default=str))
    (run_dir / "summary.md").write_text(r["ranking_md"] + "\n\n" + r.get("contended_md", "") + "\n")
    page = run_dir / "index.html"
    page.write_text(up_report.html(r, images))
    return page


def alone_note(alone: dict, starting: up_start.Starting, windows: int) -> str:
    idle = max(m["others_cpu_share"] for m in alone.values())
    warming = max(m.get("warming_cpu_share", 0.0) for m in alone.values())
    how = ("Each server alone, measured as soon as it was SERVING, while the others waited: idle ones used at "
           f"most {idle:.0%} of a core during another's measurement")
    if starting.overlap:
        how += (f"; servers still warming up (torch.compile) ran at the lowest CPU priority meanwhile, on CPU time "
                f"the measured server left unused, at most {warming:.0%} of a core")
    return (how + ". C: the closed-loop concurrency each was measured at, where its ramp (the mean of a "
            f"window up and one down per level) was fastest. Intervals: 95%, Student's t over {windows} windows; "
            "machine shared, so read them as this run's.")


def check_alive(servers: dict, failed: dict, when: str) -> None:
    """A measured server that has exited since is reported as failed (its figures stand)."""
    for kind, s in servers.items():
        if s.proc.poll() is not None and kind not in failed:
            failed[kind] = f"exited with {s.proc.returncode} {when}:\n{s.log()[-1500:]}"
            print(f"[up] {kind} FAILED: {failed[kind]}", flush=True)


def measure_and_report(stack: Stack, args, kinds: list[str], progress: Progress, clock: Clock) -> tuple:
    """Start, phase 1, phase 2, the report: (measured servers, Prometheus URL, {"page", "offers", "failed"})."""
    progress.where = "0/3 start"
    # Each kind's defaults, the model aside: the figures are then those of what a user starts.
    flags = {"model": args.model}
    overlap, why = (False, "--no-overlap: every server first") if args.no_overlap else \
        up_start.overlap_allowed(os.cpu_count() or 1, os.getloadavg()[0])
    progress(why)
    starting = up_start.Starting(stack.run_dir, kinds, flags, args.ready_timeout_seconds, free_port, progress,
                                 overlap=overlap,
                                 on_bound=lambda kind, s: stack.procs.append(Proc(kind, s.proc, s.log_path)))
    alone, prom = phase_alone(stack, starting, args, progress, clock)
    failed = starting.failed
    if not alone:
        raise StackError("no server could be measured: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    servers = {k: starting.ready[k] for k in alone}
    rows = up_report.ranking(alone)
    r = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(progress.wall_start)),
         "settings": settings_of(args, kinds), "ranking": rows, "failed": failed,
         "serving_after_s": {k: round(v, 1) for k, v in starting.ready_s.items()},
         "alone_note": alone_note(alone, starting, args.windows)}
    print("\n" + up_report.ranking_markdown(rows, failed) + "\n", flush=True)
    c = phase_contended(stack, servers, alone, args, progress)
    clock.mark("all-at-once phase")
    check_alive(servers, failed, "during or before the all-at-once phase (its alone figures stand)")
    r.update(contended=c, contended_md=c["md"], ranking_md=up_report.ranking_markdown(rows, failed),
             contended_note=f"One trainer rank per server, one-sequence RPCs, rollouts of "
                            f"{next(iter(c['offers'].values()))['rollout_size']} sequences paced at "
                            f"{args.utilization:.0%} of each server's capacity share; makespan: the wait for one "
                            f"whole rollout's scores.")
    print("\n" + c["md"] + "\n", flush=True)
    r["wall_s"] = time.monotonic() - progress.t0
    r["phases"] = clock.phases
    page = write_report(stack.run_dir, r, alone, prom, progress)
    clock.mark("report")
    return servers, prom, {"page": page, "offers": c["offers"], "failed": failed}


def keep_running(stack: Stack, servers: dict, prom: str | None, offers: dict, page: pathlib.Path) -> None:
    """Servers, Prometheus and a Locust web UI (preset with phase 2's sized load) until Ctrl-C."""
    port = free_port(8089)
    sized = {k: up_sizing.Offer(**o) for k, o in offers.items()}
    ui = stack.spawn("locust-ui", locust_command(servers, sized, ["--web-host", "127.0.0.1", "--web-port", str(port)]))
    wait_http(ui, f"http://127.0.0.1:{port}/", "the Locust web UI")
    print("[up] --keep-running: everything stays up until Ctrl-C", flush=True)
    for kind, s in servers.items():
        print(f"[up]   {kind}: {s.target if s.transport == 'grpc' else s.base_url} "
              f"(metrics http://127.0.0.1:{s.metrics_port}/metrics)")
    if prom:
        print(f"[up]   Prometheus: {prom}")
    print(f"[up]   Locust web UI: http://127.0.0.1:{port}\n[up]   report: {page}", flush=True)
    watched = [p for p in stack.procs if p.name != "locust" and p.popen.poll() is None]  # not the failed
    while all(p.popen.poll() is None for p in watched):
        time.sleep(1)
    gone = [p.name for p in watched if p.popen.poll() is not None]
    raise StackError(f"{', '.join(gone)} exited; stopping the rest")


def parse_kinds(spec: str) -> list[str]:
    kinds = [k for k in spec.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise StackError(f"--kinds {spec!r}: unknown {unknown}; choose from {', '.join(ALL_KINDS)}")
    return kinds


def up(args) -> int:
    try:
        kinds = parse_kinds(args.kinds)
    except StackError as e:
        print(f"rmscore up: error: {e}")
        return 2
    run_dir = pathlib.Path(args.out) if args.out else ROOT / "runs" / time.strftime("up-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(run_dir)

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    # SIGINT too: a process started in the background by a non-interactive shell inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler, so Ctrl-C (or a test's SIGINT)
    # did nothing and `--keep-running` never stopped.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # A first guess of the wall time; replanned from the first server's measurement on.
    progress = Progress(60 + 30 * len(kinds) + args.duration_seconds + STOP_TIMEOUT_S / 2 + 20)
    clock = Clock()
    try:
        servers, prom, out = measure_and_report(stack, args, kinds, progress, clock)
        print(f"[up] report: {out['page']}\n[up] logs, Locust CSV/JSON, result.json, plots: {run_dir}", flush=True)
        if args.keep_running:
            keep_running(stack, servers, prom, out["offers"], out["page"])
        if out["failed"]:
            print(f"[up] exit status {EXIT_SOME_FAILED}: {len(out['failed'])} of {len(kinds)} server kinds failed "
                  f"({', '.join(out['failed'])}); the ranking holds the others", flush=True)
            return EXIT_SOME_FAILED
        return 0
    except StackError as e:
        print(f"[up] FAILED: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("[up] interrupted", flush=True)
        return 130
    finally:
        if not clock.phases or clock.phases[-1]["phase"] != "report":
            clock.mark("until it stopped early")
        print("[up] stopping everything it started ...", flush=True)
        stack.stop()
        clock.mark("stop")
        print(f"[up] wall time {time.monotonic() - progress.t0:.0f} s: {clock.breakdown()}", flush=True)


def add_parsers(sub) -> None:
    p = sub.add_parser("up", help="which server kind is fastest here: each alone, then all at once, a report page",
                       description="Every server kind and Prometheus on 127.0.0.1: each server measured alone "
                                   "(capacity ramp, then repeated windows with 95%% intervals: the ranking), then "
                                   "the Locust RLHF users against all at once at a load sized from that, then "
                                   "plots and one HTML page. Servers run without TLS or tokens (those are for a "
                                   "deployment, not this stack).")
    p.add_argument("--kinds", default=",".join(ALL_KINDS), help="server kinds to start (default: all)")
    p.add_argument("--model", default="models/default")
    p.add_argument("--out", default="", help="run directory (default: runs/up-<time>)")
    p.add_argument("--warmup-seconds", type=float, default=2.0, help="per server, before its ramp (default: %(default)s)")
    p.add_argument("--ramp-window-seconds", type=float, default=1.5,
                   help="one window per ramp level (default: %(default)s)")
    p.add_argument("--max-concurrency", type=int, default=64,
                   help="the ramp's last level; it stops earlier once a server saturates (default: %(default)s)")
    p.add_argument("--windows", type=int, default=5, help="measurement windows per server (default: %(default)s)")
    p.add_argument("--window-seconds", type=float, default=0,
                   help="seconds per window; 0 sizes it from the server's capacity (default: %(default)s)")
    p.add_argument("--duration-seconds", type=int, default=60,
                   help="phase 2 (all at once) run time; 60 s fills the dashboards' 1-minute rates (default: %(default)s)")
    p.add_argument("--utilization", type=float, default=0.5,
                   help="phase 2 offers each server this fraction of its capacity share (default: %(default)s)")
    p.add_argument("--ready-timeout-seconds", type=float, default=900,
                   help="time allowed for warm-up, torch.compile included (default: %(default)s)")
    p.add_argument("--no-overlap", action="store_true",
                   help="measure no server until every one is SERVING (by default, on a machine with CPU to "
                        "spare, the first ready are measured while torch.compile still warms up at nice 19)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave servers, Prometheus and a Locust web UI up after the report, until Ctrl-C")
    p.set_defaults(func=up)
