"""The markdown report and the PNG plots of a run (matplotlib, Agg backend)."""

from __future__ import annotations

import math
import pathlib

from rmscore_tools.stats import CI

PLOTS = ("throughput_vs_concurrency.png", "latency_distributions.png", "rollout_makespan.png",
         "batching_ablation.png")
STUDY_PARITY = 5.7e-6


def _ci(d: dict) -> CI:
    return CI(d["mean"], d["lo"], d["hi"], d["half_width"], d["sd"], d["n"], d.get("confidence", 0.95))


def fmt_ci(d: dict | None, digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
    """A CI dict (stats.CI.as_dict) as `mean ± half`, its values times `scale`, then `unit`."""
    if not d:
        return "n/a"
    scaled = {**d, **{k: d[k] * scale for k in ("mean", "lo", "hi", "half_width", "sd")}}
    return _ci(scaled).fmt(digits) + unit


def _short(config_id: str) -> str:
    return config_id


SHORT_KIND = {"cpp-grpc": "cpp", "py-grpc-onnxruntime": "py-ort", "py-grpc-eager": "py-eager",
              "py-grpc-compile": "py-compile", "py-http-onnxruntime": "http-ort"}


def _label(config_id: str) -> str:
    """Two short lines for crowded plot axes: cpp / length_aware."""
    kind, _, batching = config_id.partition("/")
    return f"{SHORT_KIND.get(kind, kind)}\n{batching}"


def _verdict_text(p: dict) -> str:
    if p["verdict"] == "overlap":
        return "overlap"
    if p["verdict"] == "n/a":
        return "n/a"
    return f"**{p['better']}** better (separated)"


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x is not None and math.isfinite(x) else "n/a"


def _load_range(record: dict) -> tuple[float, float]:
    xs = [v for s in record["sessions"] for k in ("load_avg_start", "load_avg_end") for v in s.get(k, [])[:1]]
    xs += record["meta"].get("load_avg_start", [])[:1] + record["meta"].get("load_avg_end", [])[:1]
    return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))


def markdown(record: dict, summary: dict, notes: list[str] | None = None) -> str:
    L: list[str] = []
    _md_header(record, L.append, notes)
    for mode in record["settings"]["modes"]:
        if summary["servers"].get(mode):
            _md_servers(record, summary, mode, L.append)
    for section in (_md_inproc, _md_ablation, _md_parity, _md_claims):
        section(record, summary, L.append)
    L.append("## Plots\n")
    for p in PLOTS:
        L.append(f"![{p[:-4].replace('_', ' ')}]({p})")
    L.append("")
    L.append("Every run's raw data (per repetition, every latency) is in `run.json` next to this report.")
    return "\n".join(L) + "\n"


def _md_header(record: dict, add, notes: list[str] | None) -> None:
    s, meta = record["settings"], record["meta"]
    lo, hi = _load_range(record)
    add(f"# rmscore benchmark: preset `{s['preset']}`\n")
    add(f"- Run: {meta.get('started', '?')} to {meta.get('finished', '(unfinished)')}, commit "
        f"`{meta.get('commit', '')[:12]}`, client: {meta.get('client')}.")
    add(f"- Machine: {meta.get('cpu')}, {meta.get('cores')} cores, {meta.get('platform')}. "
        f"1-minute load average between {lo:.1f} and {hi:.1f} at the sampled moments "
        f"(the benchmark itself accounts for up to about {1 + s['intra_op_threads']} of it in isolated mode).")
    add(f"- Threads, equal for every runtime, served and in-process: intra-op {s['intra_op_threads']}, "
        f"inter-op {s['inter_op_threads']}. Batching knobs, equal for every server: max batch "
        f"{s['max_batch_size']} sequences, max {s['max_batch_tokens']} padded tokens, max queue delay "
        f"{s['max_queue_delay_ms']:g} ms.")
    add(f"- Workload: {meta.get('length_mix')}; requests of {s['chunk_size']} sequences (one RPC each); rollouts "
        f"of {s['rollout_size']} sequences with every chunk in flight together.")
    add(f"- K = {s['repeats']} independent repetitions per configuration, each on freshly started servers: "
        f"warm-up {s['warmup_s']:g} s, then per closed-loop level {s['settle_s']:g} s settling + {s['window_s']:g} s "
        f"measured, open loop {s['window_s']:g} s at {s['open_rate_seq_s']:g} seq/s offered (Poisson, at most "
        f"{s['max_outstanding']} requests outstanding), {s['rollouts_per_rep']} rollout(s).")
    add(f"- Modes: {', '.join(s['modes'])}. Every figure is the mean over repetitions ± the half-width of its 95% "
        "confidence interval (Student's t, K-1 degrees of freedom). Two configurations differ on a figure "
        "only when their intervals do not overlap (the study's test).")
    for n in (notes or []) + list(s.get("notes") or []):
        add(f"- Note: {n}")
    if meta.get("interrupted"):
        add("- **Interrupted**: the run was stopped early; only the phases listed below were measured.")
    if record.get("skipped"):
        add("- Skipped: " + "; ".join(f"{k['kind']} ({k['reason']})" for k in record["skipped"]))
    add("")


def _md_servers(record: dict, summary: dict, mode: str, add) -> None:
    s = record["settings"]
    conc = list(s["concurrency"])
    data = summary["servers"][mode]
    add(f"## Servers, {mode}\n")
    add("### Closed-loop throughput (sequences/s)\n")
    add("| configuration | " + " | ".join(f"C={c}" for c in conc) + " |")
    add("|---|" + "---:|" * len(conc))
    for cid, figs in data.items():
        add(f"| {_short(cid)} | " + " | ".join(fmt_ci(figs[f'closed.c{c}.throughput']) for c in conc) + " |")
    add("\n### Closed-loop latency per request (ms)\n")
    add("| configuration | C | p50 | p95 | p99 |")
    add("|---|---:|---:|---:|---:|")
    for cid, figs in data.items():
        for c in conc:
            add(f"| {_short(cid)} | {c} | " + " | ".join(fmt_ci(figs[f'closed.c{c}.{q}']) for q in
                                                     ("p50", "p95", "p99")) + " |")
    add(f"\n### Open loop, {s['open_rate_seq_s']:g} sequences/s offered\n")
    add("| configuration | answered seq/s | p50 ms | p95 ms | p99 ms | shed | request errors | failed starts |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|")
    for cid, figs in data.items():
        e = summary["errors"][mode][cid]
        add(f"| {_short(cid)} | {fmt_ci(figs['open.throughput'])} | " +
            " | ".join(fmt_ci(figs[f'open.{q}']) for q in ("p50", "p95", "p99")) +
            f" | {e['shed']} | {e['request_errors']} | {e['failed_starts']} |")
    add(f"\n### Rollout makespan ({s['rollout_size']} sequences, chunks of {s['chunk_size']})\n")
    add("| configuration | makespan s |")
    add("|---|---:|")
    for cid, figs in data.items():
        add(f"| {_short(cid)} | {fmt_ci(figs['rollout.makespan'])} |")
    add("\n### Pairwise: do the 95% intervals overlap?\n")
    keys = [f"closed.c{c}.throughput" for c in conc] + [f"closed.c{conc[-1]}.p95", "open.p95",
                                                          "rollout.makespan"]
    labels = {f["key"]: f"{f['label']} ({f['unit']})" for f in summary["figures"]}
    add("| figure | A | B | verdict | A/B |")
    add("|---|---|---|---|---:|")
    for k in keys:
        for p in summary["pairs"][mode].get(k, []):
            add(f"| {labels[k]} | {p['a']} | {p['b']} | {_verdict_text(p)} | {_ratio(p['ratio_a_over_b'])} |")
    add("")


def _md_inproc(record: dict, summary: dict, add) -> None:
    s = record["settings"]
    if not summary.get("inproc"):
        return
    add("## In-process runtimes (no server)\n")
    add(f"Whole rollouts of {s['rollout_size']} sequences, batched by the servers' length-aware planner with "
        "the same limits and threads; no transport, no queue.\n")
    add("| runtime | seq/s | makespan s |")
    add("|---|---:|---:|")
    for rt, v in summary["inproc"].items():
        add(f"| {rt} | {fmt_ci(v['throughput'])} | {fmt_ci(v['makespan'])} |")
    add("")
    for k, ps in summary["inproc_pairs"].items():
        for p in ps:
            add(f"- {k}: {p['a']} vs {p['b']}: {_verdict_text(p)} (A/B {_ratio(p['ratio_a_over_b'])})")
    iso = summary["servers"].get("isolated") or {}
    if iso:
        add("\nServed against in-process, rollout makespan (isolated):\n")
        add("| configuration | served s | in-process s (same runtime) | served / in-process |")
        add("|---|---:|---:|---:|")
        for cid, figs in iso.items():
            backend = next(c["backend"] for c in record["configs"] if c["id"] == cid)
            base = summary["inproc"].get(backend)
            ratio = figs["rollout.makespan"]["mean"] / base["makespan"]["mean"] if base else float("nan")
            add(f"| {cid} | {fmt_ci(figs['rollout.makespan'])} | {fmt_ci(base['makespan']) if base else 'n/a'} | "
                f"{_ratio(ratio)} |")
    add("")


def _md_ablation(record: dict, summary: dict, add) -> None:
    if not summary.get("ablation"):
        return
    ab = record["inproc"]["ablation"]
    add("## Batching ablation (in-process)\n")
    add(f"{ab['backend']}, rollouts of {ab['rollout_size']} sequences that arrived together, cut into batches by "
        f"`rmscore.core.planner.plan`: `no_batching` = one sequence per batch; `fifo_fixed` = arrival order, "
        f"{ab['max_batch_size']} per batch; `token_budget` = arrival order, at most {ab['max_batch_tokens']} "
        "padded tokens; `length_aware` = the servers' length-aware mode (both limits). Order of policies rotated per "
        "repetition.\n")
    add("| policy | seq/s | makespan s | real/padded tokens | batches | max abs score diff vs no_batching |")
    add("|---|---:|---:|---:|---:|---:|")
    for p, v in summary["ablation"].items():
        add(f"| {p} | {fmt_ci(v['throughput'])} | {fmt_ci(v['makespan'])} | {fmt_ci(v['padding_efficiency'])} | "
            f"{fmt_ci(v['batches'])} | {v['max_abs_score_diff_vs_no_batching']:.1e} |")
    add("")
    for p in summary["ablation_pairs"].get("throughput", []):
        add(f"- throughput: {p['a']} vs {p['b']}: {_verdict_text(p)} (A/B {_ratio(p['ratio_a_over_b'])})")
    add("")


def _md_parity(record: dict, summary: dict, add) -> None:
    s = record["settings"]
    par = summary.get("parity") or {}
    if not par.get("reference"):
        return
    add("## Parity\n")
    add(f"Largest |score − {par['reference']} score| over a fixed set of {s['parity_set_size']} sequences "
        "(each scored alone in-process; through each server in repetition 0, batched as the server likes).\n")
    add("| scorer | max abs diff |")
    add("|---|---:|")
    for k, v in {**{f"in-process {k}": v for k, v in par["runtimes"].items()}, **par["servers"]}.items():
        add(f"| {k} | {v:.1e} |")
    add("")


def _md_claims(record: dict, summary: dict, add) -> None:
    claims = study_claims(record, summary)
    if not claims:
        return
    add("## The study's CPU claims beside this run\n")
    add("| the study (CPU) | this run | agrees? |")
    add("|---|---|---|")
    for c in claims:
        add(f"| {c['claim']} | {c['evidence']} | {c['agrees']} |")
    add("")


def _highest_c_key(record: dict) -> str:
    return f"closed.c{list(record['settings']['concurrency'])[-1]}.throughput"


def _find_pair(summary: dict, mode: str, key: str, a: str, b: str) -> dict | None:
    for p in summary["pairs"].get(mode, {}).get(key, []):
        if {p["a"], p["b"]} == {a, b}:
            return p
    return None


def _separated_for(p: dict | None, who: str) -> str:
    """'yes' (who is better, separated), 'no' (the other is better, separated), 'overlap', 'n/a'."""
    if p is None or p["verdict"] == "n/a":
        return "n/a"
    if p["verdict"] == "overlap":
        return "overlap"
    return "yes" if p["better"] == who else "no"


def _ratio_for(p: dict, who: str) -> float:
    r = p["ratio_a_over_b"]
    return r if p["a"] == who else (1 / r if r else float("nan"))


def study_claims(record: dict, summary: dict) -> list[dict]:
    """The study's CPU claims, each with this run's evidence and verdict.

    Verdicts follow the overlap test: a claimed difference is reproduced only when the intervals are
    separated in the claimed direction; overlapping intervals mean "not reproduced", not "refuted";
    separation the other way contradicts the claim."""
    out = _claim_parity(record, summary)
    iso = summary["servers"].get("isolated") or {}
    for batching in record["settings"]["batching"]:
        if f"cpp-grpc/{batching}" in iso:
            out += _claims_cpp_vs(record, summary, batching)
    out += _claim_batching(record, summary)
    return out


def _claim_figures(record: dict) -> tuple[tuple[str, str], ...]:
    C = list(record["settings"]["concurrency"])[-1]
    return (_highest_c_key(record), f"throughput C={C}"), ("rollout.makespan", "rollout makespan")


def _claim_parity(record: dict, summary: dict) -> list[dict]:
    cpp0 = f"cpp-grpc/{record['settings']['batching'][0]}"
    d = (summary.get("parity") or {}).get("servers", {}).get(cpp0)
    if d is None:
        return []
    return [{"claim": f"C++ ORT matches PyTorch to {STUDY_PARITY:.1e}",
             "evidence": f"max abs diff of cpp-grpc vs in-process eager on the parity set: {d:.1e}",
             "agrees": "yes" if d <= 1e-5 else "no (larger difference)"}]


def _claims_cpp_vs(record: dict, summary: dict, batching: str) -> list[dict]:
    """C++ ORT against each other server kind, and where the gain comes from, for one batching policy."""
    iso = summary["servers"]["isolated"]
    cpp, figures, out = f"cpp-grpc/{batching}", _claim_figures(record), []
    for other in ("py-grpc-eager", "py-grpc-compile", "py-http-onnxruntime"):
        oid = f"{other}/{batching}"
        if oid not in iso:
            continue
        parts, states = [], []
        for k, label in figures:
            p = _find_pair(summary, "isolated", k, cpp, oid)
            if p is None:
                continue
            states.append(_separated_for(p, cpp))
            parts.append(f"{label}: {_verdict_text(p)}, cpp/other {_ratio(_ratio_for(p, cpp))}")
        if "no" in states:
            agree = f"no: {other} ahead with separated intervals"
        elif states and all(x == "yes" for x in states):
            agree = "yes"
        elif "yes" in states:
            agree = "partly"
        else:
            agree = "not reproduced: intervals overlap"
        out.append({"claim": f"C++ ORT beats {other} ({batching}) with non-overlapping CIs",
                    "evidence": "; ".join(parts), "agrees": agree})
    if f"py-grpc-onnxruntime/{batching}" in iso:
        out.append(_claim_ort_not_cpp(summary, batching, figures))
    return out


def _claim_ort_not_cpp(summary: dict, batching: str, figures) -> dict:
    cpp, pyort = f"cpp-grpc/{batching}", f"py-grpc-onnxruntime/{batching}"
    lang = [_find_pair(summary, "isolated", k, cpp, pyort) for k, _ in figures]
    ev = [f"cpp vs py-grpc-onnxruntime, {lab}: {_verdict_text(x)}" for (_, lab), x in zip(figures, lang) if x]
    same_runtime = all(x["verdict"] == "overlap" for x in lang if x)
    ort_ahead = "n/a"
    r = [x for x in (summary.get("inproc_pairs") or {}).get("makespan", [])
         if {x["a"], x["b"]} == {"onnxruntime", "eager"}]
    if r:
        ort_ahead = _separated_for(r[0], "onnxruntime")
        ev.append(f"in-process onnxruntime vs eager, makespan: {_verdict_text(r[0])}")
    if not same_runtime:
        agree = "no: C++ and Python servers on the same ORT differ (separated)"
    elif ort_ahead == "yes":
        agree = "yes"
    elif ort_ahead == "no":
        agree = "no: eager ahead of ORT in-process"
    else:
        agree = "partly: C++ and Python ORT indistinguishable; ORT ahead of eager not shown (overlap)"
    return {"claim": f"the gain comes from ORT, not from C++ ({batching})", "evidence": "; ".join(ev),
            "agrees": agree}


def _claim_batching(record: dict, summary: dict) -> list[dict]:
    ab = summary.get("ablation") or {}
    ab_pairs = (summary.get("ablation_pairs") or {}).get("throughput", [])
    if not (ab and ab_pairs):
        return []
    first = record["settings"]["batching"][0]
    cpp0 = f"cpp-grpc/{first}"
    best = max(ab, key=lambda p: ab[p]["throughput"]["mean"])
    worst = min(ab, key=lambda p: ab[p]["throughput"]["mean"])
    pb = next(x for x in ab_pairs if {x["a"], x["b"]} == {best, worst})
    batching_shown = _separated_for(pb, best) == "yes"
    ev = [f"batching, {best} vs {worst}: {_ratio(_ratio_for(pb, best))}x, {_verdict_text(pb)}"]
    others_separated = []
    for x in (summary.get("inproc_pairs") or {}).get("throughput", []):
        ev.append(f"runtime in-process, {x['a']} vs {x['b']}: {_ratio(x['ratio_a_over_b'])}x, {_verdict_text(x)}")
        if x["verdict"] in ("A", "B"):
            others_separated.append(abs(math.log(x["ratio_a_over_b"])))
    for k, label in _claim_figures(record):
        p = _find_pair(summary, "isolated", k, cpp0, f"py-grpc-onnxruntime/{first}")
        if p:
            ev.append(f"language (C++ vs Python, both ORT), {label}: {_ratio(_ratio_for(p, cpp0))}x, "
                      f"{_verdict_text(p)}")
            if p["verdict"] in ("A", "B"):
                others_separated.append(abs(math.log(p["ratio_a_over_b"])))
    effect = abs(math.log(_ratio_for(pb, best)))
    if not batching_shown:
        agree = "not reproduced: batching policies overlap"
    elif all(e < effect for e in others_separated):
        agree = "yes: the largest separated difference is between batching policies"
    else:
        agree = "no: a runtime or language difference is larger"
    return [{"claim": "batching strategy matters more than language or runtime", "evidence": "; ".join(ev),
             "agrees": agree}]


# ---- plots ---------------------------------------------------------------------------------
def plots(record: dict, summary: dict, out_dir: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = pathlib.Path(out_dir)
    modes = [m for m in record["settings"]["modes"] if summary["servers"].get(m)]
    drawings = (_plot_throughput, _plot_latency, _plot_makespan, _plot_ablation)
    return [_save(draw(plt, record, summary, modes), out_dir / name, plt) for draw, name in zip(drawings, PLOTS)]


def _plot_throughput(plt, record: dict, summary: dict, modes: list[str]):
    """Throughput vs concurrency with CI bands."""
    s = record["settings"]
    conc = list(s["concurrency"])
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(6.5 * max(1, len(modes)), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes or ["isolated"]):
        for cid, figs in (summary["servers"].get(mode) or {}).items():
            m = [figs[f"closed.c{c}.throughput"]["mean"] for c in conc]
            lo = [figs[f"closed.c{c}.throughput"]["lo"] for c in conc]
            hi = [figs[f"closed.c{c}.throughput"]["hi"] for c in conc]
            line, = ax.plot(conc, m, marker="o", label=cid)
            ax.fill_between(conc, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc, [str(c) for c in conc])
        ax.set_xlabel("closed-loop concurrency (requests in flight)")
        ax.set_ylabel("throughput (sequences/s)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{mode}: mean and 95% CI over K={s['repeats']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _plot_latency(plt, record: dict, summary: dict, modes: list[str]):
    """Latency distributions (per-request latencies pooled over repetitions)."""
    s = record["settings"]
    conc = list(s["concurrency"])
    cols = [f"C={c}" for c in conc] + ["open loop"]
    fig, axes = plt.subplots(max(1, len(modes)), len(cols), figsize=(3.2 * len(cols), 3.6 * max(1, len(modes))),
                             squeeze=False)
    for r, mode in enumerate(modes or ["isolated"]):
        sessions = [x for x in record["sessions"] if x["mode"] == mode]
        ids = list((summary["servers"].get(mode) or {}).keys())
        for j, col in enumerate(cols):
            ax = axes[r][j]
            data = []
            for cid in ids:
                pooled = []
                for x in sessions:
                    if x["config"] != cid:
                        continue
                    if j < len(conc):
                        rows = x.get("closed") or []
                        pooled += rows[j]["latencies_ms"] if j < len(rows) else []
                    else:
                        pooled += (x.get("open") or {}).get("latencies_ms", [])
                data.append([v for v in pooled if math.isfinite(v)] or [float("nan")])
            if ids:
                ax.boxplot(data, whis=(1, 99), showfliers=False)
                ax.set_xticks(range(1, len(ids) + 1), [_label(i) for i in ids], fontsize=7, rotation=45,
                              ha="right")
                if any(v > 0 for d in data for v in d if math.isfinite(v)):
                    ax.set_yscale("log")
                else:
                    ax.text(0.5, 0.5, "no request answered\ninside the window", ha="center", va="center",
                            transform=ax.transAxes, fontsize=8)
            ax.set_title(f"{mode}, {col}", fontsize=9)
            if j == 0:
                ax.set_ylabel("latency per request (ms)")
            ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Latency distributions: box = p25..p75, line = median, whiskers = p1..p99", fontsize=10)
    fig.tight_layout()
    return fig


def _plot_makespan(plt, record: dict, summary: dict, modes: list[str]):
    """Rollout makespan: servers per mode, and in-process runtimes."""
    s = record["settings"]
    labels, means, errs, colors = [], [], [], []
    palette = {"isolated": "tab:blue", "contended": "tab:orange", "in-process": "tab:green"}
    for mode in modes:
        for cid, figs in summary["servers"][mode].items():
            d = figs["rollout.makespan"]
            labels.append(_label(cid) + f"\n{mode}")
            means.append(d["mean"])
            errs.append(d["half_width"] if math.isfinite(d["half_width"]) else 0)
            colors.append(palette[mode])
    for rt, v in (summary.get("inproc") or {}).items():
        labels.append(f"{rt}\nin-process")
        means.append(v["makespan"]["mean"])
        errs.append(v["makespan"]["half_width"] if math.isfinite(v["makespan"]["half_width"]) else 0)
        colors.append(palette["in-process"])
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels) + 2), 4.5))
    if labels:
        ax.bar(range(len(labels)), means, yerr=errs, color=colors, capsize=4)
        ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylim(bottom=0)
    from matplotlib.patches import Patch

    used = [k for k in palette if any(c == palette[k] for c in colors)]
    if used:
        ax.legend(handles=[Patch(color=palette[k], label=k) for k in used], fontsize=8)
    ax.set_ylabel(f"makespan of a {s['rollout_size']}-sequence rollout (s)")
    ax.set_title("Rollout makespan: mean and 95% CI")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def _plot_ablation(plt, record: dict, summary: dict, modes: list[str]):
    """Batching ablation."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ab = summary.get("ablation") or {}
    if ab:
        names = list(ab)
        m = [ab[p]["throughput"]["mean"] for p in names]
        e = [ab[p]["throughput"]["half_width"] if math.isfinite(ab[p]["throughput"]["half_width"]) else 0
             for p in names]
        bars = ax.bar(range(len(names)), m, yerr=e, capsize=5, color="tab:purple")
        for b, p in zip(bars, names):
            ax.annotate(f"{100 * ab[p]['padding_efficiency']['mean']:.0f}% real\ntokens\n"
                        f"{ab[p]['batches']['mean']:.0f} batches",
                        (b.get_x() + b.get_width() / 2, 0), ha="center", va="bottom", fontsize=7, color="white",
                        xytext=(0, 4), textcoords="offset points")
        ax.set_xticks(range(len(names)), names)
        ax.set_ylim(bottom=0)
        ax.set_title(f"Batching ablation ({record['inproc']['ablation']['backend']}, in-process): mean and 95% CI")
    else:
        ax.text(0.5, 0.5, "no ablation in this run", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("throughput (sequences/s)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig

def _save(fig, path: pathlib.Path, plt) -> pathlib.Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
