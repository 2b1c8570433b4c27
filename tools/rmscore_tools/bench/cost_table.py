"""`rmscore profile`: the cost table a `cost_aware` server plans with, as a table and a plot.

    rmscore profile                                   # measure the default model on ONNX Runtime here
    rmscore profile --backend eager --intra-op-threads 1 --out runs/profile-eager.png
    rmscore profile --cost-profile runs/cost.json     # show a saved profile (measured and saved if missing)

It measures exactly as a server's warm-up does (rmscore.core.cost_profile.measure on the backend the
servers create, the same flags and budget), prints milliseconds per sequence for each batch size
and padded length, and plots them: on a CPU the lines rise or stay flat with the batch size (small
batches are as cheap per sequence), on a GPU they fall (large batches are nearly free).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np


def add_parsers(sub) -> None:
    p = sub.add_parser("profile", help="measure or show the cost table cost_aware batching plans with",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/default", help="model repository (default: %(default)s)")
    p.add_argument("--backend", default="onnxruntime", help="eager, compile or onnxruntime (default: %(default)s)")
    p.add_argument("--intra-op-threads", type=int, default=2, help="threads of one session (default: %(default)s)")
    p.add_argument("--model-workers", type=int, default=1,
                   help="the worker count the profile is for: each session gets intra-op-threads / N (default: 1)")
    p.add_argument("--max-batch-size", type=int, default=32, help="(default: %(default)s)")
    p.add_argument("--precision", default="fp32", help="(default: %(default)s)")
    p.add_argument("--device", default="cpu", help="(default: %(default)s)")
    p.add_argument("--cost-profile-seconds", type=float, default=10.0, help="measuring budget (default: %(default)s)")
    p.add_argument("--cost-profile", default=None, help="a saved profile to show (measured and saved there if missing)")
    p.add_argument("--out", default="cost-profile.png", help="the plot (default: %(default)s)")
    p.set_defaults(func=main)


def plot(table, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = list(table.batch_sizes)
    for j, n in enumerate(table.lengths):
        ax.plot(sizes, [table.cost_us[i][j] / b / 1e3 for i, b in enumerate(sizes)], marker="o", label=f"L = {n}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("model ms per sequence")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, title="padded length")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(cfg, repo):
    """Measures as ScoringCore does at warm-up: the same runtime, warm-up, budget and clock (the table,
    the seconds spent, and how it was timed)."""
    from rmscore.core import cost_profile
    from rmscore.core.runtime import progress
    from rmscore.runtimes.workers import create_workers

    backend = create_workers(cfg, repo, cfg.model_workers)[0]
    backend.warmup(cfg.max_batch_size, repo.max_sequence_length)
    rng = np.random.default_rng(0)
    timing = cost_profile.timing(cfg.device, cfg.intra_op_threads // cfg.model_workers)
    clock = cost_profile.clock(timing)

    def run(b: int, n: int) -> float:
        ids = rng.integers(min(1000, repo.vocab_size - 1), repo.vocab_size, size=(b, n), dtype=np.int64)
        t = clock()
        backend.score(ids, np.ones((b, n), np.int64))
        return clock() - t

    table, spent = cost_profile.measure(run, cfg.max_batch_size, repo.max_sequence_length,
                                        cfg.cost_profile_seconds, progress)
    return table, spent, timing


def main(args) -> int:
    from rmscore.core import cost_profile
    from rmscore.core.config import ConfigError, ServeConfig
    from rmscore.model.repository import load_repo

    try:
        cfg = ServeConfig(model=pathlib.Path(args.model), backend=args.backend, intra_op_threads=args.intra_op_threads,
                          model_workers=args.model_workers, max_batch_size=args.max_batch_size,
                          precision=args.precision, device=args.device, cost_profile_seconds=args.cost_profile_seconds,
                          cost_profile=pathlib.Path(args.cost_profile) if args.cost_profile else None)
    except ConfigError as e:
        print(f"rmscore profile: error: {e}", file=sys.stderr)
        return 2
    repo = load_repo(cfg.model)
    identity = cost_profile.identity(repo, cfg)
    if cfg.cost_profile is not None and cfg.cost_profile.exists():
        try:
            table, _ = cost_profile.load(cfg.cost_profile, identity)
        except cost_profile.ProfileError as e:
            print(f"rmscore profile: error: {e}", file=sys.stderr)
            return 2
        source = f"loaded from {cfg.cost_profile}"
    else:
        table, spent, timing = measure(cfg, repo)
        source = f"measured in {spent:.1f} s"
        if cfg.cost_profile is not None:
            cost_profile.save(cfg.cost_profile, table, identity, spent, timing)
            source += f", saved to {cfg.cost_profile}"
    print(cost_profile.describe(table))
    title = (f"{repo.name} on {cfg.backend} ({cfg.device}, {cfg.model_workers} x "
             f"{cfg.intra_op_threads // cfg.model_workers} threads), {source}")
    plot(table, pathlib.Path(args.out), title)
    print(f"rmscore profile: {source}; plot {args.out}")
    return 0
