"""`rmscore up`'s results: the ranking, Prometheus read back, the plots and one static HTML page.

* `ranking`: servers by phase-1 throughput, every figure also as a ratio to the fastest, and
  whether its interval is separated from the fastest one's (`stats.overlaps`).
* `dashboard_queries` / `panel_values`: the Grafana dashboards' own PromQL, read from
  docker/grafana/dashboards/*.json at run time (never copied), with Grafana's variables filled
  as "All", run as instant queries against this run's Prometheus: the page shows what the
  dashboards would show, so the two cannot disagree.
* `contended_series`: phase 2 over time, by query_range.
* `plots` and `html`: PNGs (matplotlib, Agg) and one page with them inlined as data: URIs, so the
  page needs nothing else to render.
"""

from __future__ import annotations

import base64
import html as htmlmod
import json
import math
import pathlib
import re

import httpx

from rmscore_tools.stats import CI, overlaps

DASHBOARDS = "docker/grafana/dashboards"
# Grafana's variables as the dashboards' defaults fill them: every server, every backend; a rate
# window of a minute (the recording rules' own), which phase 2 lasts at least by default.
GRAFANA_VARIABLES = {"$server": ".*", "$backend": ".*", "$__rate_interval": "1m", "$__interval": "15s",
                     "$__range": "5m"}
PLOTS = ("throughput.png", "latency.png", "ramp.png", "contended.png")


# ---- ranking ---------------------------------------------------------------------------------

def _ci(d: dict) -> CI:
    return CI(**d)


def ranking(alone: dict[str, dict]) -> list[dict]:
    """One row per measured server, fastest first: throughput, p50, p99 (means with intervals) and
    each as a ratio to the fastest server's; `separated`: intervals of throughput do not overlap."""
    order = sorted(alone, key=lambda k: -alone[k]["throughput"]["mean"])
    if not order:
        return []
    best = alone[order[0]]
    rows = []
    for k in order:
        m = alone[k]
        rows.append({
            "kind": k, "concurrency": m["concurrency"], "throughput": m["throughput"], "p50_ms": m["p50_ms"],
            "p99_ms": m["p99_ms"], "errors": m["errors"],
            "throughput_ratio": m["throughput"]["mean"] / best["throughput"]["mean"],
            "p50_ratio": m["p50_ms"]["mean"] / best["p50_ms"]["mean"],
            "p99_ratio": m["p99_ms"]["mean"] / best["p99_ms"]["mean"],
            "separated": k != order[0] and not overlaps(_ci(m["throughput"]), _ci(best["throughput"])),
        })
    return rows


def ranking_markdown(rows: list[dict], failed: dict[str, str]) -> str:
    lines = ["| # | server | seq/s (95% CI) | x fastest | p50 ms | x | p99 ms | x | C | vs fastest |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        vs = "fastest" if i == 1 else ("slower (CIs apart)" if r["separated"] else "CIs overlap")
        lines.append(f"| {i} | {r['kind']} | {_ci(r['throughput']).fmt()} | {r['throughput_ratio']:.2f} | "
                     f"{_ci(r['p50_ms']).fmt()} | {r['p50_ratio']:.2f} | {_ci(r['p99_ms']).fmt()} | "
                     f"{r['p99_ratio']:.2f} | {r['concurrency']} | {vs} |")
    for kind, why in failed.items():
        lines.append(f"| - | {kind} | failed: {why.splitlines()[0][:80] if why else '?'} | | | | | | | |")
    return "\n".join(lines)


def contended_markdown(rows: list[dict]) -> str:
    lines = ["| server | offered seq/s | scored seq/s | share of all scored | rollouts | makespan p50 s | "
             "makespan p99 s | RPC p99 ms | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['offered_seq_s']:.1f} | {r['scored_seq_s']:.1f} | {r['share']:.0%} | "
                     f"{r['rollouts']} | {r['makespan_p50_s']:.2f} | {r['makespan_p99_s']:.2f} | "
                     f"{r['rpc_p99_ms']:.0f} | {r['errors']} |")
    return "\n".join(lines)


# ---- Prometheus --------------------------------------------------------------------------------

def prom_query(base: str, expr: str, at: float) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr, "time": at}, timeout=30).json()
    if r.get("status") != "success":
        raise RuntimeError(f"Prometheus query {expr!r}: {r.get('error', r)}")
    return r["data"]["result"]


def prom_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query_range",
                  params={"query": expr, "start": start, "end": end, "step": step}, timeout=30).json()
    if r.get("status") != "success":
        raise RuntimeError(f"Prometheus query_range {expr!r}: {r.get('error', r)}")
    return r["data"]["result"]


def _panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def dashboard_queries(root: pathlib.Path) -> list[dict]:
    """Every panel target of every provisioned dashboard, its variables filled (GRAFANA_VARIABLES)."""
    out = []
    for path in sorted((root / DASHBOARDS).glob("*.json")):
        board = json.loads(path.read_text())
        for panel in _panels(board.get("panels", [])):
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if not expr:
                    continue
                for var, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(var, value)
                out.append({"dashboard": board.get("title", path.stem), "panel": panel.get("title", ""),
                            "expr": expr, "legend": target.get("legendFormat", ""), "unit": unit})
    return out


def _legend(fmt: str, labels: dict) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "-"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def panel_values(base: str, root: pathlib.Path, at: float) -> list[dict]:
    """One row per (panel, series): what the dashboards show at `at` (the end of phase 2)."""
    rows = []
    for q in dashboard_queries(root):
        try:
            result = prom_query(base, q["expr"], at)
        except (RuntimeError, httpx.HTTPError) as e:
            rows.append({**q, "series": "query failed", "value": str(e)[:200]})
            continue
        if not result:
            rows.append({**q, "series": "(no data)", "value": ""})
        for s in result:
            rows.append({**q, "series": _legend(q["legend"], s["metric"]), "value": s["value"][1]})
    return rows


def contended_series(base: str, start: float, end: float, step: float) -> dict[str, list[dict]]:
    """Phase 2 over time per server (`service`, the label the run's Prometheus config gives each
    target): sequences/s, request p99 and queue depth, over a rate window of a few scrapes."""
    w = f"{max(5, round(4 * step))}s"
    start = min(start + int(w[:-1]), end)  # the first rate window would reach back into phase 1
    exprs = {
        "sequences/s": f"sum by (service) (rate(rmscore_sequences_scored_total[{w}]))",
        "request p99 (s)": f"histogram_quantile(0.99, sum by (service, le) "
                           f"(rate(rmscore_request_latency_seconds_bucket[{w}])))",
        "queue depth (sequences)": "sum by (service) (rmscore_queue_depth)",
    }
    return {name: prom_range(base, e, start, end, step) for name, e in exprs.items()}


# ---- plots -------------------------------------------------------------------------------------

def plots(rows: list[dict], alone: dict[str, dict], series: dict | None, out_dir: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    for name, draw in zip(PLOTS, (_plot_throughput, _plot_latency, _plot_ramp, _plot_contended)):
        fig = draw(plt, rows, alone, series)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        drawn.append(out_dir / name)
    return drawn


def _plot_throughput(plt, rows, alone, series):
    """Phase 1: throughput per server, fastest first, with its 95% interval over the windows."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    kinds = [r["kind"] for r in rows]
    means = [r["throughput"]["mean"] for r in rows]
    half = [r["throughput"]["half_width"] if math.isfinite(r["throughput"]["half_width"]) else 0 for r in rows]
    ax.barh(kinds[::-1], means[::-1], xerr=half[::-1], capsize=4, color="#4c78a8")
    ax.set_xlabel("sequences/s, alone (mean and 95% CI over the windows)")
    ax.set_title("Throughput of each server alone")
    ax.grid(alpha=0.3, axis="x")
    return fig


def _plot_latency(plt, rows, alone, series):
    """Phase 1: the latency distribution of every server, as an empirical CDF (log time axis)."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for r in rows:
        lat = np.sort(np.asarray(alone[r["kind"]]["latencies_ms"], dtype=float))
        if len(lat):
            ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=f"{r['kind']} (C={r['concurrency']})")
    ax.set_xscale("log")
    ax.set_xlabel("request latency, ms (one sequence per request)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency distribution alone, at each server's measured concurrency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _plot_ramp(plt, rows, alone, series):
    """Phase 1: the concurrency ramp that found each server's capacity: each level's mean of its
    windows up and down the ramp, the bar spanning the two."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for r in rows:
        ramp = alone[r["kind"]]["ramp"]
        xs, ys = [p["concurrency"] for p in ramp], [p["throughput"] for p in ramp]
        ws = [p.get("windows", [p["throughput"]]) for p in ramp]
        line, = ax.plot(xs, ys, marker="o", label=r["kind"])
        ax.vlines(xs, [min(w) for w in ws], [max(w) for w in ws], color=line.get_color(), alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("closed-loop concurrency (requests in flight)")
    ax.set_ylabel("sequences/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Capacity ramp, defaults (mean of a window up and one down)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _plot_contended(plt, rows, alone, series):
    """Phase 2 from Prometheus: every server's rate, p99 and queue over time."""
    names = list(series or {}) or ["(Prometheus not running)"]
    fig, axes = plt.subplots(len(names), 1, figsize=(7, 2.4 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        curves = (series or {}).get(name, [])
        t0 = min((float(s["values"][0][0]) for s in curves if s["values"]), default=0.0)
        for s in curves:
            xs = [float(t) - t0 for t, _ in s["values"]]
            ys = [float(v) if v not in ("NaN", "+Inf", "-Inf") else float("nan") for _, v in s["values"]]
            ax.plot(xs, ys, label=s["metric"].get("service", "?"))
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
        if curves:
            ax.legend(fontsize=6, loc="upper right")
    axes[0, 0].set_title("All servers at once (Locust RLHF users), from Prometheus")
    axes[-1, 0].set_xlabel("seconds into phase 2")
    return fig


# ---- the page ----------------------------------------------------------------------------------

def _e(x) -> str:
    return htmlmod.escape(str(x))


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _md_table(md: str) -> str:
    """A markdown table (as printed on the terminal) as HTML, so both show the same cells."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return _table(cells[0], cells[1:]) if cells else ""


def _img(path: pathlib.Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{_e(path.stem)}" src="data:image/png;base64,{data}"><figcaption>{_e(path.name)}</figcaption></figure>'


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;"
         "text-align:left;max-width:420px;word-break:break-word}th{background:#eee}img{max-width:100%}figure{margin:1em 0}code{background:#f4f4f4}"
         "figcaption{font-size:11px;color:#666}.note{color:#555;font-size:13px}")


def html(r: dict, images: list[pathlib.Path]) -> str:
    """The whole page: ranking, contended phase, plots, the dashboards' panels, settings."""
    s = r["settings"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>rmscore up {_e(r['started'])}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>rmscore up: which runtime is fastest here</h1><p class='note'>{_e(r['started'])}, "
             f"{_e(s['cores'])} cores ({_e(s['cpu'])}), wall time {r['wall_s']:.0f} s"
             + "".join(f"; {_e(p['phase'])} {p['took_s']:.0f} s" + (f" ({_e(p['note'])})" if p.get("note") else "")
                       for p in r.get("phases", [])) + ".</p>",
             "<h2>1. Each server alone</h2>", _md_table(r["ranking_md"]),
             f"<p class='note'>{_e(r['alone_note'])}</p>",
             "<h2>2. All at once (Locust RLHF users)</h2>", _md_table(r.get("contended_md", "")),
             f"<p class='note'>{_e(r.get('contended_note', ''))}</p>",
             "<h2>Plots</h2>", *[_img(p) for p in images],
             "<h2>What the Grafana dashboards show (their own PromQL, end of phase 2)</h2>",
             _table(["dashboard", "panel", "series", "value", "unit", "query"],
                    [[p["dashboard"], p["panel"], p["series"], _num(p["value"]), p["unit"], p["expr"]]
                     for p in r.get("panels", [])]) if r.get("panels") else "<p>Prometheus was not running.</p>",
             "<h2>Settings</h2>", _table(["setting", "value"], [[k, v] for k, v in s.items()]),
             "</body></html>"]
    return "\n".join(parts)


def _num(v) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{x:.4g}"
