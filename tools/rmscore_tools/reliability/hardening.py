"""`rmscore hardening`: every fault scenario and the hostile-input corpus on every server kind, as a report.

    rmscore hardening                                        # all kinds, report sizes
    rmscore hardening --kinds cpp-grpc --soak-seconds 1800   # one kind, a longer soak
    rmscore hardening --report-only docs/hardening/results.json

Per kind, one server serves overload, cancel, the hostile corpus and the soak; it is then SIGKILLed
mid-rollout and restarted on its port, and the restarted one is drained with SIGTERM (so a slow
warm-up, the compile kind's, is paid twice). Writes OUT/results.json, OUT/report.md, OUT/*.png and
with --doc, the figures section of that markdown file (between its marker comments, appended
when it has none; the prose stays). By default no doc is touched: docs/hardening.md is reference,
and a run worth keeping is filed under docs/bench/ with its date. The servers run on 127.0.0.1 (rmscore_tools.launch.start), plaintext and without an auth token.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import sys
import time

from rmscore_tools.reliability import faults
BEGIN, END = "<!-- hardening:figures:begin -->", "<!-- hardening:figures:end -->"
SOAK_GOAL_PCT = 5.0


def add_parsers(sub) -> None:
    from rmscore_tools.args import comma_list
    from rmscore_tools.kinds import ALL_KINDS

    p = sub.add_parser("hardening", help="faults, overload, soak and hostile inputs on every server kind: a report",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--kinds", type=comma_list(), help=f"server kinds, comma-separated, from {', '.join(ALL_KINDS)}")
    p.add_argument("--out", default="docs/hardening", help="output directory (default: %(default)s)")
    p.add_argument("--doc", default="",
                   help="markdown file whose figures section is rewritten (default: none; docs/hardening.md is "
                        "reference, dated runs go under docs/bench/)")
    p.add_argument("--overload-seconds", type=float, default=15.0, help="open-loop overload (default: %(default)s)")
    p.add_argument("--overload-factor", type=float, default=4.0, help="x the measured capacity (default: %(default)s)")
    p.add_argument("--soak-seconds", type=float, default=120.0, help="measured soak (default: %(default)s)")
    p.add_argument("--soak-warmup-seconds", type=float, default=20.0, help="load before the first RSS sample")
    p.add_argument("--soak-concurrency", type=int, default=4)
    p.add_argument("--cancel-rounds", type=int, default=8)
    p.add_argument("--kill-sequences", type=int, default=256, help="rollout size of the kill/restart run")
    p.add_argument("--no-hostile", action="store_true", help="skip the hostile-input corpus")
    p.add_argument("--stall-connections", type=int, default=40, help="stalled-body clients (default: %(default)s)")
    p.add_argument("--stall-mib", type=float, default=15.0, help="each one's body, MiB (default: %(default)s)")
    p.add_argument("--flood-items", type=int, default=200_000, help="items of the flooding ScoreStream")
    p.add_argument("--pings", type=int, default=200_000, help="PING frames of the HTTP/2 ping flood")
    p.add_argument("--no-transport", action="store_true", help="skip the transport attacks")
    p.add_argument("--only-transport", action="store_true", help="run the transport attacks alone")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", metavar="RESULTS_JSON", help="rewrite report, plots and doc from a results.json")
    p.set_defaults(func=main)


class _Log:
    def __init__(self, enabled: bool):
        self.enabled, self.t0 = enabled, time.perf_counter()

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[hardening {time.perf_counter() - self.t0:6.0f} s] {msg}", file=sys.stderr, flush=True)


def _scenario(log: _Log, kind: str, name: str, fn):
    log(f"{kind}: {name} ...")
    t = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - recorded; the other scenarios still run
        log(f"{kind}: {name} FAILED: {e!s:.300}")
        return {"error": f"{type(e).__name__}: {e!s:.2000}"}
    log(f"{kind}: {name} done in {time.perf_counter() - t:.0f} s")
    return out


def run_kind(kind: str, args, log: _Log) -> dict:
    rec: dict = {"kind": kind}
    t = time.perf_counter()
    try:
        server = faults.start(kind)
    except Exception as e:  # noqa: BLE001
        log(f"{kind}: did not start: {e!s:.300}")
        return {**rec, "error": f"did not start: {e!s:.2000}"}
    rec["start_s"] = time.perf_counter() - t
    if getattr(args, "only_transport", False):
        try:
            rec["transport"] = _transport(server, args, log)
        finally:
            server.stop(30)
        return rec
    try:
        rec["overload"] = _scenario(log, kind, "overload", lambda: faults.overload(
            server, seconds=args.overload_seconds, factor=args.overload_factor))
        rec["cancel"] = _scenario(log, kind, "cancel", lambda: faults.cancel(server, rounds=args.cancel_rounds))
        rec["hostile"] = _hostile(server, args, log)
        rec["transport"] = _transport(server, args, log)

        shown = [0.0]

        def tick(t_s, total_s, count):
            if t_s - shown[0] >= 15:  # a line every 15 s: readable in a log file as on a terminal
                shown[0] = t_s
                log(f"{kind}: soak {t_s:4.0f}/{total_s:.0f} s, {count['requests']} requests, "
                    f"{count['errors']} errors")
        rec["soak"] = _scenario(log, kind, "soak", lambda: faults.soak(
            server, seconds=args.soak_seconds, warmup_s=args.soak_warmup_seconds,
            concurrency=args.soak_concurrency, progress=tick))
        holder = {}

        def kill():
            fig, holder["new"] = faults.kill_restart(server, sequences=args.kill_sequences)
            return fig
        rec["kill_restart"] = _scenario(log, kind, "kill and restart", kill)
        server = holder.get("new", server)
        if server.proc.poll() is None:
            rec["drain"] = _scenario(log, kind, "drain", lambda: faults.drain(server))
        else:
            rec["drain"] = {"error": "no server left to drain"}
    finally:
        if server.proc.poll() is None:
            server.stop(30)
    return rec


def _hostile(server, args, log: _Log) -> dict:
    if args.no_hostile:
        return {"not_run": "--no-hostile"}
    try:
        from rmscore_tools.reliability.hostile import run_corpus
    except ImportError as e:
        return {"not_run": f"rmscore_tools.reliability.hostile not importable: {e}"}
    fig = _scenario(log, server.kind, "hostile inputs",
                    lambda: run_corpus(server.kind, "127.0.0.1", server.port, server.transport))
    fig.pop("results", None)  # per-case detail: docs/fuzzing.md's business, not this table's
    return fig


def _transport(server, args, log: _Log) -> dict:
    """The transport attacks (rmscore_tools.reliability.transport: stalled bodies, a flooding stream, a
    work flood, a PING flood, framing), one after another."""
    if getattr(args, "no_transport", False):
        return {"not_run": "--no-transport"}
    from rmscore_tools.reliability import transport

    def run() -> dict:
        fig = {"stalled": transport.stalled_bodies(server, connections=args.stall_connections,
                                                   body_bytes=int(args.stall_mib * (1 << 20))),
               "flood": transport.stream_flood(server, items=args.flood_items),
               "work": transport.work_flood(server),
               "framing": transport.framing(server)}
        if server.transport == "grpc":
            fig["pings"] = transport.ping_flood(server, pings=args.pings)
        return fig
    return _scenario(log, server.kind, "transport attacks", run)


def main(args) -> int:
    if args.report_only:
        path = pathlib.Path(args.report_only)
        record = json.loads((path / "results.json" if path.is_dir() else path).read_text())
        out = (path if path.is_dir() else path.parent)
    else:
        from rmscore_tools.kinds import ALL_KINDS
        from rmscore_tools.host import machine_info

        kinds = list(args.kinds or ALL_KINDS)
        unknown = [k for k in kinds if k not in ALL_KINDS]
        if unknown:
            raise SystemExit(f"rmscore hardening: unknown kinds {unknown}")
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        log = _Log(not args.no_progress)
        settings = {k: v for k, v in vars(args).items() if k not in ("func", "report_only") and not callable(v)}
        record = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "settings": settings,
                  "machine": machine_info(), "loadavg_start": list(os.getloadavg()), "flags": faults.FLAGS, "kinds": []}
        for kind in kinds:
            record["kinds"].append(run_kind(kind, args, log))
            (out / "results.json").write_text(json.dumps(record, indent=1, default=str))
        record["seconds"] = time.perf_counter() - log.t0
        (out / "results.json").write_text(json.dumps(record, indent=1, default=str))
    write_outputs(record, out, pathlib.Path(args.doc) if args.doc else None)
    print(f"rmscore hardening: wrote {out / 'report.md'}" + (f" and {args.doc}" if args.doc else ""), file=sys.stderr)
    return 0 if all("error" not in k for k in record["kinds"]) else 1


# ---- the report --------------------------------------------------------------------------

def _f(x, digits: int = 0, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, (int, float)):
        return f"{x:,.{digits}f}{unit}"
    return str(x)


def _get(rec: dict, scenario: str, default=None):
    s = rec.get(scenario)
    if not isinstance(s, dict) or "error" in s or "not_run" in s:
        return default
    return s


def _row_or_error(rec: dict, scenario: str, ncols: int) -> str | None:
    s = rec.get(scenario)
    if "error" in rec:
        why = rec["error"]
    elif not isinstance(s, dict):
        why = "not run"
    elif "error" in s:
        why = s["error"]
    elif "not_run" in s:
        why = "not run: " + s["not_run"]
    else:
        return None
    return f"| {rec['kind']} | " + " | ".join([why.splitlines()[0][:120]] + [""] * (ncols - 2)) + " |"


def markdown(record: dict) -> str:
    st = record["settings"]
    m = record.get("machine", {})
    flags = ", ".join("--" + k.replace("_", "-") + f" {v}" for k, v in record["flags"].items())
    load = " ".join(f"{x:.1f}" for x in record.get("loadavg_start", ()))
    lines = [f"Measured {record.get('started', '?')} at commit {m.get('commit', '?')[:10]} on {m.get('cores', '?')} "
             f"cores ({m.get('cpu', '?')}), load average at start {load or '?'} (a shared machine); "
             f"server flags {flags}. "
             f"Rerun: `rmscore hardening --overload-seconds {st.get('overload_seconds'):g} "
             f"--soak-seconds {st.get('soak_seconds'):g} --soak-warmup-seconds {st.get('soak_warmup_seconds'):g} "
             f"--cancel-rounds {st.get('cancel_rounds')} --kill-sequences {st.get('kill_sequences')}`.", ""]

    def table(title, scenario, header, row):
        if st.get("only_transport") and scenario != "transport":
            return  # --only-transport: no tables of "not run" rows
        lines.extend([f"**{title}**", "", "| kind | " + " | ".join(header) + " |",
                      "|---" * (len(header) + 1) + "|"])
        for rec in record["kinds"]:
            bad = _row_or_error(rec, scenario, len(header) + 1)
            lines.append(bad if bad else f"| {rec['kind']} | " + " | ".join(row(rec[scenario])) + " |")
        lines.append("")

    table(f"Overload: {st.get('overload_factor', 4):g}x the measured capacity, open loop, "
          f"at least {st.get('overload_seconds'):g} s (longer where the queue would not overflow)", "overload",
          ["capacity seq/s", "offered seq/s", "seconds", "requests", "accepted", "refused", "lost", "refusal p99 ms",
           "accepted p50 / p99 ms", "full-queue bound ms", "normal after"],
          lambda o: [_f(o["capacity_seq_s"], 1), _f(o["offered_seq_s"], 1), _f(o["seconds"], 1), _f(o["offered"]), _f(o["accepted"]),
                     _f(o["refused"]), _f(o["lost"]), _f(o["refuse_ms"]["p99"], 1),
                     f"{_f(o['accepted_ms']['p50'])} / {_f(o['accepted_ms']['p99'])}",
                     _f(o["queue_drain_bound_ms"]), _f(o["served_normally_after"])])
    table("Kill and restart: SIGKILL mid-rollout, restart on the same port, the client retries", "kill_restart",
          ["sequences", "chunks done at kill", "restart s", "chunks retried", "rollout s",
           "complete, once, correct"],
          lambda k: [_f(k["sequences"]), f"{k['answered_before_kill']}/{k['chunks']}", _f(k["restart_s"], 1),
                     _f(k["chunks_retried"]), _f(k["rollout_s"], 1), _f(k["complete_unique_correct"])])
    table("Drain: SIGTERM with requests in flight (times after the signal)", "drain",
          ["in flight answered", "NOT_SERVING seen ms", "first refusal ms", "SERVING after a refusal", "exit s",
           "exit code", "within grace"],
          lambda d: [f"{d['in_flight_answered_ok']}/{d['in_flight']}", _f(d["not_serving_seen_ms"], 1),
                     _f(d["first_refusal_ms"], 1), _f(d["health_serving_after_refusal"]), _f(d["exit_s"], 1),
                     _f(d["exit_code"]), _f(d["exit_within_grace"])])
    table("Cancelled and vanished clients", "cancel",
          ["offered seq", "scored seq", "dropped (cancelled)", "idle after each round", "RSS per round MiB",
           "RSS growth, 2nd half"],
          lambda c: [_f(c["offered_sequences"]), _f(c["scored_sequences"]), _f(c["dropped_cancelled"]),
                     _f(c["idle_after_every_round"]), " ".join(f"{x:.0f}" for x in c["rss_mb"]),
                     _f(c["rss_growth_pct"], 2, " %")])
    table(f"Soak: {st.get('soak_concurrency')} clients, closed loop, {st.get('soak_seconds'):g} s after "
          f"{st.get('soak_warmup_seconds'):g} s of warm-up", "soak",
          ["requests", "errors", "seq/s", "RSS start MiB", "RSS end MiB", "RSS max MiB", "growth",
           f"goal < {SOAK_GOAL_PCT:g} %", "slope MiB/min"],
          lambda s: [_f(s["requests"]), _f(s["errors"]), _f(s["seq_s"], 1), _f(s["rss_start_mb"], 1),
                     _f(s["rss_end_mb"], 1), _f(s["rss_max_mb"], 1), _f(s["rss_growth_pct"], 2, " %"),
                     _f(abs(s["rss_growth_pct"]) < SOAK_GOAL_PCT), _f(s["rss_slope_mb_per_min"], 2)])
    table("Hostile inputs (rmscore_tools.reliability.hostile corpus, a good request after each)", "hostile",
          ["inputs tried", "outcomes", "unexpected", "good between correct", "alive after", "slowest error ms"],
          lambda h: [_f(h["inputs_tried"]), ", ".join(f"{k} {v}" for k, v in sorted(h["outcomes"].items())),
                     _f(len(h["unexpected"])), f"{h['good_between_correct']}/{h['good_between']}",
                     _f(h["server_alive"]), _f(h["max_error_ms"], 1)])
    _transport_tables(record, table)
    if any("soak" in rec for rec in record["kinds"]):
        lines.append("Plots: [soak RSS](hardening/soak_rss.png), [time to refuse](hardening/refuse_ms.png).")
    return "\n".join(lines) + "\n"


def _yes(x) -> str:
    """yes/no without _f's bold "no": here "no" can be the good answer."""
    return "n/a" if x is None else ("yes" if x else "no")


def _transport_tables(record: dict, table) -> None:
    st = record["settings"]
    if st.get("no_transport") or not any("transport" in r for r in record["kinds"]):
        return
    probes = ["probes", "answered", "refused < 100 ms", "failed"]

    def probe_cells(f):
        return [_f(f["probes"]), _f(f["answered"]), _f(f["refused_fast"]), _f(f["failed"])]
    table(f"Stalled bodies: {st.get('stall_connections')} clients each send all but the last byte of a "
          f"{st.get('stall_mib'):g} MiB body and stop; RSS after = lowest in 3 s after they went", "transport",
          ["RSS before MiB", "with them MiB", "after MiB", "after vs before", "answered while stalled", *probes],
          lambda t: [_f(t["stalled"]["rss_before_mb"]), _f(t["stalled"]["rss_held_mb"]),
                     _f(t["stalled"]["rss_after_mb"]), _f(t["stalled"]["rss_after_pct"], 1, " %"),
                     _f(t["stalled"]["answered_while_stalled"]), *probe_cells(t["stalled"])])
    table(f"One ScoreStream sending {st.get('flood_items'):,} items as fast as it may, probes meanwhile",
          "transport", ["stream answers (errors)", "stream end", *probes, "slowest probe ms"],
          lambda t: ["not run (HTTP)"] + [""] * 6 if "not_run" in t["flood"] else
          [f"{t['flood']['stream_answers']:,} ({t['flood']['stream_errors']:,})", t["flood"]["stream_end"],
           *probe_cells(t["flood"]), _f(t["flood"]["probe_max_ms"])])
    table("A queue bounded by work: 8 clients sending requests of 128 sequences of 512 tokens back to back "
          "for 8 s (deadline 13 s), probes (2 s deadline) meanwhile", "transport",
          ["flood answers", "most work queued s", *probes, "slowest probe ms"],
          lambda t: ["not run"] + [""] * 6 if "work" not in t else
          [", ".join(f"{k} {v}" for k, v in sorted(t["work"]["flood_codes"].items())),
           _f(t["work"]["max_expected_wait_s"], 1), *probe_cells(t["work"]), _f(t["work"]["probe_max_ms"])])
    table(f"HTTP/2 PING flood ({st.get('pings'):,} PINGs, no call open) and framing", "transport",
          ["pings written", "server CPU s", "GOAWAY", "HTTP CL+TE status", "closed", "2nd request served",
           "malformed grpc-timeout"],
          lambda t: [_f(t.get("pings", {}).get("pings_written")), _f(t.get("pings", {}).get("server_cpu_s"), 2),
                     _f(t.get("pings", {}).get("goaway_code")), _f(t["framing"].get("cl_te_status")),
                     _yes(t["framing"].get("cl_te_closed")), _yes(t["framing"].get("cl_te_second_request_served")),
                     _f(t["framing"].get("malformed_grpc_timeout_status"))])


def rss_plot(soaks: list[tuple[str, dict]], path: pathlib.Path, title: str, minutes: bool = False) -> None:
    """Resident memory over time, one line per (label, faults.soak figures); also soak_long.py's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 60.0 if minutes else 1.0
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, s in soaks:
        ax.plot([p[0] / scale for p in s["samples"]], [p[1] for p in s["samples"]], marker=None if minutes else ".",
                label=f"{label} ({s['rss_growth_pct']:+.1f} %)")
    ax.set_xlabel(f"{'minutes' if minutes else 'seconds'} after the warm-up")
    ax.set_ylabel("resident memory (VmRSS), MiB")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plots(record: dict, out: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = [out / "soak_rss.png"]
    soaks = [(rec["kind"], _get(rec, "soak")) for rec in record["kinds"]]
    rss_plot([(kind, s) for kind, s in soaks if s], made[-1], "Soak: server resident memory under steady load")

    fig, ax = plt.subplots(figsize=(8, 4.5))
    data, labels = [], []
    for rec in record["kinds"]:
        o = _get(rec, "overload")
        if o and o.get("refuse_ms_all"):
            data.append(o["refuse_ms_all"])
            labels.append(f"{rec['kind']}\n(n={len(o['refuse_ms_all'])})")
    if data:
        ax.boxplot(data, whis=(1, 99), showfliers=True)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_yscale("log")
    ax.set_ylabel("time to RESOURCE_EXHAUSTED, ms (log)")
    ax.set_title("Overload: time to refuse (whiskers p1..p99)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    made.append(out / "refuse_ms.png")
    fig.savefig(made[-1], dpi=110)
    plt.close(fig)
    return made


def write_outputs(record: dict, out: pathlib.Path, doc: pathlib.Path | None) -> None:
    table = markdown(record)
    (out / "report.md").write_text("# rmscore hardening report\n\n" + table)
    if not record["settings"].get("only_transport"):  # the plots are of overload and soak
        plots(record, out)
    if doc is None:
        return
    section = f"{BEGIN}\n<!-- written by `rmscore hardening`; edits here are overwritten -->\n\n{table}\n{END}"
    text = doc.read_text() if doc.exists() else "# Hardening\n\n## Measured figures\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text)
