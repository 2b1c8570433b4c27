"""`rmscore bench --precision`: every graph precision of a repository beside fp32, in one table and one plot.

Each precision's ONNX Runtime session (the servers' settings) scores the same RLHF-like rollout, cut
into batches by the servers' length-aware planner. Precisions run interleaved, in a rotated order
each repetition, and the throughput ratio to fp32 is taken *within* a repetition, so load drift on
a shared machine hits both sides of a ratio alike; the interval is the t interval over repetitions.
The accuracy figures are the exporter's, from the manifest (docs/precision.md).
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from rmscore_tools.bench.inproc import plan_batches
from rmscore_tools.stats import mean_ci
from rmscore_tools.workload import LengthMix, make_rollout

#: The RLHF length mix of the full preset.
LENGTHS = "lognormal:160:0.6:32:512"


def _sessions(repo: pathlib.Path, manifest: dict, threads: int) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # fp16 graphs are GPU graphs (docs/precision.md): measured only where CUDA is.
    cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    return {p: ort.InferenceSession(str(repo / g), so, providers=["CUDAExecutionProvider" if p == "fp16"
                                                                   else "CPUExecutionProvider"])
            for p, g in manifest["graphs"].items() if p != "fp16" or cuda}


def _batches(manifest: dict, rollout_size: int, lengths: str, seed: int) -> list[tuple]:
    from rmscore.model.padding import pad_batch

    seqs = make_rollout(np.random.default_rng(seed), rollout_size, LengthMix.parse(lengths), manifest["vocab_size"])
    plan = plan_batches([len(s) for s in seqs], "length_aware", 32, 8192)
    return [pad_batch([seqs[i] for i in b], manifest["pad_token_id"]) for b in plan]


def run(model: str, rollout_size: int = 128, repeats: int = 5, threads: int = 2, lengths: str = LENGTHS,
        seed: int = 0) -> dict:
    repo = pathlib.Path(model)
    manifest = json.loads((repo / "manifest.json").read_text())
    sessions = _sessions(repo, manifest, threads)
    batches = _batches(manifest, rollout_size, lengths, seed)
    n = sum(ids.shape[0] for ids, _ in batches)
    order = sorted(sessions)
    for s in sessions.values():  # warm-up: first runs allocate
        s.run(["scores"], {"input_ids": batches[0][0], "attention_mask": batches[0][1]})
    seq_s: dict[str, list[float]] = {p: [] for p in order}
    for rep in range(repeats):
        for p in order[rep % len(order):] + order[:rep % len(order)]:
            t = time.perf_counter()
            for ids, mask in batches:
                sessions[p].run(["scores"], {"input_ids": ids, "attention_mask": mask})
            seq_s[p].append(n / (time.perf_counter() - t))
    return {"format": "rmscore-bench-precision-1", "model": str(repo), "version": manifest["version"],
            "rollout_size": rollout_size, "lengths": lengths, "repeats": repeats, "threads": threads,
            "seq_s": seq_s, "accuracy": {p: _accuracy(manifest, p) for p in order}}


def _accuracy(manifest: dict, precision: str) -> dict | None:
    if precision == "fp32":
        return {"spearman": 1.0, "pairwise_order_agreement": 1.0, "max_abs_diff": 0.0}
    return manifest["parity"].get(precision, {}).get("ranking")


def rows(record: dict) -> list[dict]:
    base = record["seq_s"]["fp32"]
    out = []
    for p, v in record["seq_s"].items():
        ratio = mean_ci([a / b for a, b in zip(v, base)])
        acc = record["accuracy"].get(p) or {}
        gate = acc.get("gate") or {}
        passes = (None if not gate else acc["spearman"] >= gate["min_spearman"]
                  and acc["pairwise_order_agreement"] >= gate["min_pairwise_order_agreement"])
        out.append({"precision": p, "seq_s": mean_ci(v), "ratio": ratio, "acc": acc, "passes": passes})
    return out


def markdown(record: dict) -> str:
    def fmt(x, spec):
        return format(x, spec) if isinstance(x, (int, float)) else "-"

    lines = [f"# Precision vs fp32: {record['model']} ({record['version']})", "",
             f"ONNX Runtime in process, {record['threads']} threads, rollout of {record['rollout_size']} "
             f"({record['lengths']}), length-aware batches; {record['repeats']} interleaved repetitions, "
             "ratio within each, mean and 95% t interval.", "",
             "| precision | seq/s | ratio vs fp32 [95% CI] | Spearman | pairwise agreement | max abs diff | gate |",
             "|---|---|---|---|---|---|---|"]
    for r in rows(record):
        a, ci = r["acc"], r["ratio"]
        gate = {None: "-", True: "pass", False: "FAIL"}[r["passes"]] if r["precision"] != "fp32" else "reference"
        lines.append(f"| {r['precision']} | {r['seq_s'].mean:.1f} | {ci.mean:.2f}x [{ci.lo:.2f}, {ci.hi:.2f}] | "
                     f"{fmt(a.get('spearman'), '.4f')} | {fmt(a.get('pairwise_order_agreement'), '.4f')} | "
                     f"{fmt(a.get('max_abs_diff'), '.3g')} | {gate} |")
    return "\n".join(lines) + "\n"


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = rows(record)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(len(rs))
    ax.bar(x, [r["ratio"].mean for r in rs], yerr=[[r["ratio"].mean - r["ratio"].lo for r in rs],
                                                   [r["ratio"].hi - r["ratio"].mean for r in rs]], capsize=4)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, [f"{r['precision']}\nSpearman {r['acc'].get('spearman', float('nan')):.4f}\n"
                      f"pairwise {r['acc'].get('pairwise_order_agreement', float('nan')):.4f}" for r in rs])
    ax.set_ylabel("throughput / fp32 (95% CI)")
    ax.set_title("precision ladder: speed and ranking accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(model: str, out: str, repeats: int, threads: int, rollout_size: int) -> int:
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = run(model, rollout_size=rollout_size, repeats=max(2, repeats), threads=threads)
    (out_dir / "precision.json").write_text(json.dumps(record, indent=1))
    (out_dir / "precision.md").write_text(markdown(record))
    plot(record, out_dir / "precision.png")
    print(markdown(record))
    return 0
