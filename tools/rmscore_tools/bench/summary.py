"""From a run record (run.json) to figures: mean and 95% CI over repetitions, pairwise overlap verdicts."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rmscore_tools.stats import mean_ci, verdict


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    get: Callable[[dict], float]


def _nan(x) -> float:
    return float(x) if x is not None and isinstance(x, (int, float)) else float("nan")


def server_figures(concurrency: list[int]) -> list[Figure]:
    figs = []
    for i, c in enumerate(concurrency):
        def closed(sess, i=i, c=c):
            rows = sess.get("closed") or []
            return rows[i] if i < len(rows) and rows[i].get("concurrency") == c else None

        figs.append(Figure(f"closed.c{c}.throughput", f"throughput, C={c}", "seq/s", True,
                           lambda s, f=closed: _nan((f(s) or {}).get("throughput_seq_s"))))
        for q in ("p50", "p95", "p99"):
            figs.append(Figure(f"closed.c{c}.{q}", f"latency {q}, C={c}", "ms", False,
                               lambda s, f=closed, q=q: _nan(((f(s) or {}).get("latency_ms") or {}).get(q))))
    figs.append(Figure("open.throughput", "open loop: answered", "seq/s", True,
                       lambda s: _nan((s.get("open") or {}).get("throughput_seq_s"))))
    for q in ("p50", "p95", "p99"):
        figs.append(Figure(f"open.{q}", f"open loop: latency {q}", "ms", False,
                           lambda s, q=q: _nan(((s.get("open") or {}).get("latency_ms") or {}).get(q))))
    figs.append(Figure("rollout.makespan", "rollout makespan", "s", False,
                       lambda s: _nan((s.get("rollout") or {}).get("makespan_s_mean"))))
    return figs


def _pairs(cis: dict[str, object], higher_is_better: bool) -> list[dict]:
    out = []
    for a, b in itertools.combinations(sorted(cis), 2):
        ca, cb = cis[a], cis[b]
        ratio = ca.mean / cb.mean if cb.mean and math.isfinite(ca.mean) and math.isfinite(cb.mean) else float("nan")
        v = verdict(ca, cb, higher_is_better)
        out.append({"a": a, "b": b, "verdict": v, "better": {"A": a, "B": b}.get(v), "ratio_a_over_b": ratio})
    return out


def summarise(record: dict) -> dict:
    s = record["settings"]
    figs = server_figures(list(s["concurrency"]))
    servers: dict = {}
    pairs: dict = {}
    errors: dict = {}
    for mode in s["modes"]:
        sessions = [x for x in record["sessions"] if x["mode"] == mode]
        config_ids = [c["id"] for c in record["configs"]]
        servers[mode] = {}
        pairs[mode] = {}
        for cid in config_ids:
            mine = [x for x in sessions if x["config"] == cid]
            if not mine:
                continue
            servers[mode][cid] = {}
            for f in figs:
                values = [f.get(x) for x in mine]
                ci = mean_ci(values)
                servers[mode][cid][f.key] = {**ci.as_dict(), "values": values}
            errors.setdefault(mode, {})[cid] = {
                "failed_starts": sum(1 for x in mine if (x.get("server") or {}).get("error")),
                "request_errors": sum((r.get("errors") or 0) for x in mine
                                      for r in (x.get("closed") or []) + [x.get("open") or {}, x.get("rollout") or {}]),
                "shed": sum(((x.get("open") or {}).get("shed") or 0) for x in mine),
                "repetitions": len(mine),
            }
        for f in figs:
            cis = {cid: mean_ci(v[f.key]["values"]) for cid, v in servers[mode].items()}
            pairs[mode][f.key] = _pairs(cis, f.higher_is_better)
    out = {"figures": [{"key": f.key, "label": f.label, "unit": f.unit, "higher_is_better": f.higher_is_better}
                       for f in figs],
           "servers": servers, "pairs": pairs, "errors": errors}
    out.update(_inproc(record))
    out["parity"] = _parity(record)
    return out


def _inproc(record: dict) -> dict:
    ip = record.get("inproc") or {}
    if not ip or ip.get("error"):
        return {"inproc": {}, "inproc_pairs": {}, "ablation": {}, "ablation_pairs": {}}
    runtimes = {}
    for rt, r in (ip.get("runtimes") or {}).items():
        runtimes[rt] = {
            "throughput": {**mean_ci([x["throughput_seq_s"] for x in r["reps"]]).as_dict(),
                           "values": [x["throughput_seq_s"] for x in r["reps"]]},
            "makespan": {**mean_ci([x["makespan_s"] for x in r["reps"]]).as_dict(),
                         "values": [x["makespan_s"] for x in r["reps"]]},
        }
    rt_pairs = {
        "throughput": _pairs({rt: mean_ci(v["throughput"]["values"]) for rt, v in runtimes.items()}, True),
        "makespan": _pairs({rt: mean_ci(v["makespan"]["values"]) for rt, v in runtimes.items()}, False),
    }
    ablation, ab_pairs = {}, {}
    ab = ip.get("ablation")
    if ab:
        policies = list(ab["reps"][0]["policies"])
        for p in policies:
            reps = [r["policies"][p] for r in ab["reps"]]
            ablation[p] = {
                key: {**mean_ci([x[src] for x in reps]).as_dict(), "values": [x[src] for x in reps]}
                for key, src in (("throughput", "throughput_seq_s"), ("makespan", "makespan_s"),
                                 ("padding_efficiency", "padding_efficiency"), ("batches", "batches"))
            }
            ablation[p]["max_abs_score_diff_vs_no_batching"] = max(x["max_abs_score_diff_vs_no_batching"]
                                                                   for x in reps)
        ab_pairs = {
            "throughput": _pairs({p: mean_ci(v["throughput"]["values"]) for p, v in ablation.items()}, True),
            "makespan": _pairs({p: mean_ci(v["makespan"]["values"]) for p, v in ablation.items()}, False),
        }
    return {"inproc": runtimes, "inproc_pairs": rt_pairs, "ablation": ablation, "ablation_pairs": ab_pairs}


def _parity(record: dict) -> dict:
    """Largest |score - in-process eager score| on the parity set, per server and per runtime."""
    ip = record.get("inproc") or {}
    ref = (ip.get("parity_scores") or {}).get("eager")
    out = {"reference": "in-process eager" if ref is not None else None, "servers": {}, "runtimes": {}}
    if ref is None:
        return out
    ref = np.asarray(ref, dtype=np.float64)
    for rt, scores in (ip.get("parity_scores") or {}).items():
        if rt != "eager":
            out["runtimes"][rt] = float(np.abs(np.asarray(scores, dtype=np.float64) - ref).max())
    for sess in record["sessions"]:
        scores = sess.get("parity_scores")
        if isinstance(scores, list) and len(scores) == len(ref):
            d = float(np.abs(np.asarray(scores, dtype=np.float64) - ref).max())
            key = sess["config"]
            out["servers"][key] = max(d, out["servers"].get(key, 0.0))
    return out
