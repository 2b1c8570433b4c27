"""`rmscore bench --scheduling`: each server kind against the best in-process plan of its own runtime.

A trainer's real load is many concurrent one-sequence requests (OpenRLHF >= 0.9.1 sends one query
per request). Per repetition, side by side and in a rotated order:

  (a) the best in-process plan of the kind's runtime (plans.py, a child process), measured right
      before each server starts: batch 1 and sorted batches of 2..64 over one pool of the load's
      lengths; the fastest is the bar. Each server is held to the plans measured just before it,
      not minutes earlier: this machine's speed drifts by 10% and more over minutes, and a bar
      measured before every kind of the repetition had put that drift into every ratio;
  (b) every kind under every scheduling configuration on a fresh server: `default` (the kind's own
      defaults, no batching flag, what a user gets) or POLICY:WORKERS (e.g. length_aware:1,
      cost_aware:auto); closed loops of one sequence per request at each concurrency (1, 8, 64 by
      default), and the RLHF rollout workload (64 sequences in chunks of 8, every chunk in flight,
      one rollout after the other).

Printed per kind, configuration and load, mean +- 95% CI over the repetitions, every ratio taken
within a repetition: throughput; its ratio to the best plan (goal >= 0.9 at 64 in flight and on the
rollout); at 1 in flight its ratio to the runtime's batch-1 throughput (goal >= 0.95); T(8)/T(1) and
T(64)/T(1) (never slower under load: >= 0.95 and >= 1); the rollout's makespan over 64 / best plan
(goal <= 1.1); p99 latency against 1.5 x C / throughput; and at concurrency 1 the HTTP p50 minus the
gRPC p50 on the same runtime (goal <= 3 ms). cost_aware servers keep one --cost-profile per kind and
configuration in OUT, and `default` ones their cache in OUT/cost-cache (as a user's ~/.cache), each
measured at its first start and loaded by every later one. Writes OUT/scheduling.json, scheduling.md
and scheduling.png.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from rmscore_tools import kinds as kinds_registry, launch
from rmscore_tools import caller, loadgen
from rmscore_tools.bench.presets import Settings
from rmscore_tools.host import machine_info
from rmscore_tools.observe import cpu_s, metrics
from rmscore_tools.stats import mean_ci
from rmscore_tools.workload import LengthMix

LENGTHS = "lognormal:96:0.6:16:256"  # the neutral driver's mix: median 96, clipped to 16..256
#: `default`: each kind as it starts without flags (cost_aware, one worker, the cached profile).
DEFAULT = "default"
CONFIGS = (DEFAULT, "length_aware:1", "cost_aware:auto")
KINDS = ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime", "py-grpc-eager")
CONCURRENCY = (1, 8, 64)
ROLLOUT = (64, 8)  # sequences per rollout, sequences per request
CORES = os.cpu_count() or 1
CPU_KEYS = ("client_cpu_ms_per_seq", "server_cpu_ms_per_seq", "client_cpu_share")
TIME_KEYS = ("server_ms_per_request", "model_ms_per_seq", "mean_batch")
GOALS = {"ratio": 0.9, "batch1_ratio": 0.95, "c8_over_c1": 0.95, "c64_over_c1": 1.0, "makespan_factor": 1.1,
         "p99_factor": 1.5, "http_excess_ms": 3.0}


def say(msg: str) -> None:
    print(f"[bench --scheduling] {msg}", file=sys.stderr, flush=True)


def best_plans(s: Settings, model: str, rep: int, runtimes: list[str], tmp: pathlib.Path) -> dict:
    spec = {"model": model, "runtimes": runtimes, "rep": rep, "seed": s.seed, "lengths": LENGTHS, "pool_size": 256,
            "intra_op_threads": s.intra_op_threads, "inter_op_threads": s.inter_op_threads, "rollout_size": 64}
    spec_path, out_path = tmp / f"plans-{rep}.json", tmp / f"plans-{rep}.out.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "rmscore_tools.bench.plans", str(spec_path), str(out_path)],
                   check=True, cwd=launch.ROOT)
    return json.loads(out_path.read_text())["runtimes"]


def server_flags(s: Settings, config: str, profile: pathlib.Path) -> dict:
    if config == DEFAULT:  # the kind's defaults; only the threads are the run's, as for every config
        return {"intra_op_threads": s.intra_op_threads, "inter_op_threads": s.inter_op_threads,
                "cost_profile_dir": str(profile.parent / "cost-cache")}
    policy, workers = config.split(":")
    flags = {**s.server_flags(policy), "model_workers": workers}
    if policy == "cost_aware":
        flags["cost_profile"] = str(profile)
    return flags


class CpuClock:
    """CPU used by this process (the load generator: the client) and by the server while a load runs.
    On a machine where they share the cores, every client CPU-second is one the model did not get,
    so the figures split a server's shortfall between the server and the measuring client."""

    def __init__(self, server):
        self.pid = server.proc.pid
        self.t0, self.client0, self.server0 = time.monotonic(), time.process_time(), cpu_s(self.pid)

    def figures(self, sequences: int) -> dict:
        wall = time.monotonic() - self.t0
        client, server = time.process_time() - self.client0, cpu_s(self.pid) - self.server0
        per = 1e3 / max(sequences, 1)
        return {"client_cpu_ms_per_seq": client * per, "server_cpu_ms_per_seq": server * per,
                "client_cpu_share": client / (wall * CORES)}


class ServerTimes:
    """Where a load's time went inside the server, from its own metrics (docs/contract.md): the mean time
    from accepting a request to answering it, the model's wall time per sequence (a batch's run time over
    its sequences: with W workers running at once the server's throughput is at most W / that), and the
    mean batch. Against the client's time per request and the in-process plans, these split a
    shortfall between the transport and client, the batcher, and the model running slower than alone."""

    NAMES = ("rmscore_request_latency_seconds_sum", "rmscore_request_latency_seconds_count",
             "rmscore_batch_inference_seconds_sum", "rmscore_sequences_scored_total", "rmscore_batch_size_sum",
             "rmscore_batch_size_count")

    def __init__(self, server):
        self.server, self.before = server, metrics(server, *self.NAMES)

    def figures(self) -> dict:
        now = metrics(self.server, *self.NAMES)
        d = {k: now[k] - self.before[k] for k in self.NAMES}
        per = lambda a, b: a / b if b > 0 else float("nan")  # noqa: E731 - a load that ran nothing has no figure
        return {"server_ms_per_request": 1e3 * per(d["rmscore_request_latency_seconds_sum"],
                                                    d["rmscore_request_latency_seconds_count"]),
                "model_ms_per_seq": 1e3 * per(d["rmscore_batch_inference_seconds_sum"],
                                              d["rmscore_sequences_scored_total"]),
                "mean_batch": per(d["rmscore_batch_size_sum"], d["rmscore_batch_size_count"])}


async def measure_kind(server, s: Settings, wl: loadgen.Workload, rollouts: list) -> dict:
    """Every load on one fresh server: the closed loops, then the rollouts."""
    transport = kinds_registry.get(server.kind).transport
    out = {}
    one = caller.async_client(transport, caller.target_of(server), chunk_size=1, timeout_s=s.rpc_timeout_s)
    try:
        requests = wl.requests(s.seed)
        await loadgen.warmup(one, requests, 8, s.warmup_s)
        for c in CONCURRENCY:
            clock, times = CpuClock(server), ServerTimes(server)
            r = await loadgen.closed_loop(one, requests, c, s.window_s, s.settle_s, drain_timeout_s=s.rpc_timeout_s,
                                          max_settle_s=s.rpc_timeout_s)
            # Every answer of the call (settle and drain included), as the CPU was counted over all of it.
            out[f"c{c}"] = {"throughput_seq_s": r["throughput_seq_s"], "latency_ms": r["latency_ms"],
                            "errors": r["errors"], **clock.figures(r["answered_all"]), **times.figures()}
    finally:
        await one.close()
    chunked = caller.async_client(transport, caller.target_of(server), chunk_size=ROLLOUT[1], timeout_s=s.rpc_timeout_s)
    try:
        clock, times = CpuClock(server), ServerTimes(server)
        r = await loadgen.rollouts(chunked, rollouts)
        out["rollout"] = {"throughput_seq_s": ROLLOUT[0] / r["makespan_s_mean"], "makespan_s": r["makespan_s_mean"],
                          "errors": r["errors"], **clock.figures(ROLLOUT[0] * len(rollouts)), **times.figures()}
    finally:
        await chunked.close()
    return out


def repetition(rep: int, s: Settings, model: str, kinds: list[str], configs: list[str], out: pathlib.Path,
               tmp: pathlib.Path) -> dict:
    wl = loadgen.Workload(LengthMix.parse(LENGTHS), 1, ROLLOUT[0])
    rollouts = wl.rollouts(s.seed + rep, max(2, s.rollouts_per_rep))
    runs = [(k, c) for k in kinds for c in configs]
    runs = runs[rep % len(runs):] + runs[:rep % len(runs)]
    result = {"rep": rep, "plans": {}, "servers": {}}
    for i, (kind, config) in enumerate(runs):
        say(f"rep {rep + 1}/{s.repeats}, {i + 1}/{len(runs)}: {kind} {config}")
        rt = kinds_registry.get(kind).runtime
        plans = best_plans(s, model, rep, [rt], tmp)[rt]  # the bar, measured right before this server
        result["plans"].setdefault(rt, plans)  # the first of the repetition, for the plans table
        profile = out / f"cost-{kind}-{config.replace(':', '-')}.json"
        t0 = time.monotonic()
        server = launch.start(kind, ready_timeout_s=s.server_ready_timeout_s, model=model,
                              log_dir=tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp), **server_flags(s, config, profile))
        try:
            got = asyncio.run(measure_kind(server, s, wl, rollouts))
            got["startup_s"] = time.monotonic() - t0
            got["plans"] = plans
            got["workers_line"] = next((x for x in server.log().splitlines() if "model workers" in x), "")
        finally:
            server.stop(60)
        result["servers"][f"{kind} {config}"] = got
    return result


def summarise(reps: list[dict], kinds: list[str], configs: list[str]) -> dict:
    rows = {}
    for kind in kinds:
        rt = kinds_registry.get(kind).runtime
        for config in configs:
            key = f"{kind} {config}"
            per = [r for r in reps if key in r["servers"]]
            # Each server's own bar (measured right before it); runs recorded before 2026-12-06 had one per
            # repetition.
            bar = [r["servers"][key].get("plans") or r["plans"][rt] for r in per]
            for load in [f"c{c}" for c in CONCURRENCY] + ["rollout"]:
                got = [r["servers"][key][load] for r in per]  # this load's figures, one per repetition
                thr = [g["throughput_seq_s"] for g in got]
                ratio = [g["throughput_seq_s"] / b["best_seq_s"] for g, b in zip(got, bar)]
                row = {"kind": kind, "config": config, "load": load, "throughput": mean_ci(thr).as_dict(),
                       "ratio": mean_ci(ratio).as_dict(), "errors": sum(g["errors"] for g in got)}
                for k in CPU_KEYS + TIME_KEYS:  # absent from runs made before they were recorded
                    if all(k in g for g in got):
                        row[k] = mean_ci([g[k] for g in got]).as_dict()
                if load != "rollout" and all("server_ms_per_request" in g for g in got):
                    # What a caller waited per request beyond the server's accept-to-answer: the transport
                    # and the client (with c in flight a closed loop's request takes c / throughput).
                    c = int(load[1:])
                    row["outside_ms"] = mean_ci([c * 1e3 / g["throughput_seq_s"] - g["server_ms_per_request"]
                                                 for g in got if g["throughput_seq_s"] > 0]).as_dict()
                if load == f"c{max(CONCURRENCY)}":
                    p99 = [g["latency_ms"]["p99"] for g in got]
                    # A repetition that scored nothing in the window has no bound (NaN, dropped by mean_ci).
                    bound = [GOALS["p99_factor"] * max(CONCURRENCY) / t * 1e3 if t > 0 else float("nan") for t in thr]
                    row["p99_ms"], row["p99_bound_ms"] = mean_ci(p99).as_dict(), mean_ci(bound).as_dict()
                if load == "c1":
                    b1 = [g["throughput_seq_s"] / b["throughput_seq_s"]["1"] for g, b in zip(got, bar)]
                    row["batch1_ratio"] = mean_ci(b1).as_dict()
                    if all("model_ms_per_seq" in g for g in got):
                        # The model's run in the server against the same runtime's batch 1 run back to back:
                        # above 1, the runs themselves are slower there (one request at a time leaves the
                        # runtime's threads idle between runs), not the transport or the batcher.
                        row["model_over_batch1"] = mean_ci([g["model_ms_per_seq"] * b["throughput_seq_s"]["1"] / 1e3
                                                            for g, b in zip(got, bar)]).as_dict()
                elif load.startswith("c"):
                    under = [g["throughput_seq_s"] / r["servers"][key]["c1"]["throughput_seq_s"]
                             for g, r in zip(got, per) if r["servers"][key]["c1"]["throughput_seq_s"] > 0]
                    row["over_c1"] = mean_ci(under).as_dict()
                else:
                    mk = [g["makespan_s"] / (ROLLOUT[0] / b["best_seq_s"]) for g, b in zip(got, bar)]
                    row["makespan_factor"] = mean_ci(mk).as_dict()
                rows[f"{key} {load}"] = row
    http = _http_excess(reps, configs)
    plans = {rt: {b: mean_ci([r["plans"][rt]["throughput_seq_s"][b] for r in reps]).as_dict()
                  for b in reps[0]["plans"][rt]["throughput_seq_s"]} for rt in reps[0]["plans"]}
    return {"rows": rows, "http_excess_ms": http, "plans": plans}


def _http_excess(reps: list[dict], configs: list[str]) -> dict:
    out = {}
    for config in configs:
        h, g = f"py-http-onnxruntime {config}", f"py-grpc-onnxruntime {config}"
        diffs = [r["servers"][h]["c1"]["latency_ms"]["p50"] - r["servers"][g]["c1"]["latency_ms"]["p50"]
                 for r in reps if h in r["servers"] and g in r["servers"]]
        if diffs:
            out[config] = mean_ci(diffs).as_dict()
    return out


def _f(ci: dict, digits: int = 3) -> str:
    from rmscore_tools.stats import CI

    return CI(**ci).fmt(digits)


def markdown(rec: dict) -> str:
    sm = rec["summary"]
    m = rec.get("machine") or {}  # records written before the machine was kept have none
    lines = [f"# Scheduling: servers against the best in-process plan ({rec['when']})", "",
             f"Machine: {m.get('cpu') or 'not recorded'}, {m.get('cores', '?')} cores; commit "
             f"{(m.get('commit') or '?')[:12]}.", "",
             f"{rec['repeats']} repetitions, {rec['window_s']} s windows, lengths {LENGTHS}, "
             f"{rec['threads']} intra-op threads; one sequence per request at concurrency "
             f"{', '.join(map(str, CONCURRENCY))}; rollout: {ROLLOUT[0]} sequences in requests of {ROLLOUT[1]}, "
             "all in flight. Mean ± 95% CI over repetitions; ratio = server / best plan of its runtime, measured "
             f"right before that server started (goal >= {GOALS['ratio']}). The plans table shows the first "
             "measured in each repetition.", "",
             "## Best in-process plan (sequences/s)", "", "| runtime | " + " | ".join(
                 f"batch {b}" for b in next(iter(sm["plans"].values()))) + " |",
             "|---|" + "---|" * len(next(iter(sm["plans"].values())))]
    for rt, plans in sm["plans"].items():
        lines.append(f"| {rt} | " + " | ".join(_f(ci) for ci in plans.values()) + " |")
    lines += ["", "## Servers", "",
              "goal column: c1, throughput / the runtime's batch 1 (>= 0.95); c8 and c64, throughput / the same "
              f"server's at c1 (>= {GOALS['c8_over_c1']} and >= {GOALS['c64_over_c1']}); rollout, makespan / "
              f"(64 / best plan) (<= {GOALS['makespan_factor']}).", "",
              f"CPU: milliseconds of CPU per sequence used by the measuring client (this process, on the same "
              f"{CORES} cores) and by the server, and the client's share of the machine's CPU while the load ran.",
              "",
              "| kind | config | load | seq/s | ratio to best plan | goal ratio | p99 ms (bound) | CPU ms/seq client, server "
              "(client share) | errors |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in sm["rows"].values():
        p99 = f"{_f(row['p99_ms'])} ({_f(row['p99_bound_ms'])})" if "p99_ms" in row else ""
        goal = next((_f(row[k]) for k in ("batch1_ratio", "over_c1", "makespan_factor") if k in row), "")
        cpu = (f"{_f(row['client_cpu_ms_per_seq'])}, {_f(row['server_cpu_ms_per_seq'])} "
               f"({_f(row['client_cpu_share'], 2)})" if all(k in row for k in CPU_KEYS) else "")
        lines.append(f"| {row['kind']} | {row['config']} | {row['load']} | {_f(row['throughput'])} | "
                     f"{_f(row['ratio'])} | {goal} | {p99} | {cpu} | {row['errors']} |")
    timed = [row for row in sm["rows"].values() if all(k in row for k in TIME_KEYS)]
    if timed:
        lines += ["", "## Where the time goes", "",
                  "From each server's own metrics over the same loads: `server ms` is the mean time from "
                  "accepting a request to answering it; `outside ms` what the caller waited beyond that per "
                  "request (the transport and the client: c / throughput - server ms); `model ms/seq` a "
                  "batch's run time over its sequences (W workers running at once give at most W / that); "
                  "at c1, `model / batch 1` is that against the runtime's batch 1 run back to back in-process.",
                  "", "| kind | config | load | server ms | outside ms | model ms/seq | mean batch | model / batch 1 |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in timed:
            lines.append(f"| {row['kind']} | {row['config']} | {row['load']} | {_f(row['server_ms_per_request'])} | "
                         f"{_f(row['outside_ms']) if 'outside_ms' in row else ''} | {_f(row['model_ms_per_seq'])} | "
                         f"{_f(row['mean_batch'])} | "
                         f"{_f(row['model_over_batch1']) if 'model_over_batch1' in row else ''} |")
    if sm["http_excess_ms"]:
        lines += ["", f"HTTP p50 minus gRPC p50 at concurrency 1, same runtime (goal <= {GOALS['http_excess_ms']} ms): "
                  + "; ".join(f"{c}: {_f(ci)} ms" for c, ci in sm["http_excess_ms"].items())]
    workers = sorted({r["servers"][k]["workers_line"].split("] ", 1)[-1] for r in rec["reps"] for k in r["servers"]
                      if r["servers"][k]["workers_line"]})
    if workers:
        lines += ["", "Model workers chosen:", *[f"- {w}" for w in workers]]
    return "\n".join(lines) + "\n"


def plot(rec: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rec["summary"]["rows"].values())
    loads = [f"c{c}" for c in CONCURRENCY] + ["rollout"]
    groups = sorted({(r["kind"], r["config"]) for r in rows}, key=lambda g: (rec["kinds"].index(g[0]), g[1]))
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(groups)), 4.5))
    width = 0.8 / len(loads)
    for j, load in enumerate(loads):
        got = [rec["summary"]["rows"][f"{k} {c} {load}"]["ratio"] for k, c in groups]
        ax.bar([i + j * width for i in range(len(groups))], [g["mean"] for g in got], width,
               yerr=[g["half_width"] if g["n"] > 1 else 0 for g in got], capsize=2, label=load)
    ax.axhline(GOALS["ratio"], color="k", linestyle="--", linewidth=1, label=f"goal {GOALS['ratio']}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{k}\n{c}" for k, c in groups], fontsize=7)
    ax.set_ylabel("throughput / best in-process plan")
    ax.set_title("Each server against the best plan of its own runtime (95% CI)")
    ax.legend(fontsize=7, ncol=len(loads) + 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rec: dict, out: pathlib.Path) -> str:
    text = markdown(rec)
    (out / "scheduling.json").write_text(json.dumps(rec, indent=1))
    (out / "scheduling.md").write_text(text)
    plot(rec, out / "scheduling.png")
    return text


def run(s: Settings, out: pathlib.Path, model: str, kinds: list[str], configs: list[str]) -> dict:
    import datetime as dt

    out.mkdir(parents=True, exist_ok=True)
    rec = {"format": "rmscore-bench-scheduling/1", "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "kinds": kinds, "configs": configs, "repeats": s.repeats, "window_s": s.window_s,
           "threads": s.intra_op_threads, "machine": machine_info(), "reps": []}
    with tempfile.TemporaryDirectory(prefix="rmscore-sched-") as tmp:
        for rep in range(s.repeats):
            rec["reps"].append(repetition(rep, s, model, kinds, configs, out, pathlib.Path(tmp)))
            (out / "scheduling.json").write_text(json.dumps(rec, indent=1))  # the raw figures first, whatever follows
            rec["summary"] = summarise(rec["reps"], kinds, configs)
            write(rec, out)  # a partial report after every repetition: long runs show where they are
    return rec
