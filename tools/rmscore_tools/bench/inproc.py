"""In-process baselines and the batching ablation: the runtimes without any server.

Run by `rmscore bench` as a child process (`python -m rmscore_tools.bench.inproc IN.json OUT.json`), so
that PyTorch's and ONNX Runtime's thread pools live apart from the load generator and are gone when
the servers are measured.

* Runtime baselines: each runtime (`rmscore.runtimes.create`, the servers' own code and thread
  settings) scores whole rollouts, batched by the servers' length-aware planner with the servers'
  limits. Nothing else: no transport, no queue, no serialisation.
* Batching ablation: one runtime, the same rollouts, four ways of cutting them into batches, all
  through `rmscore.core.planner.plan` (the function the servers run): `no_batching` (one sequence per
  batch), `fifo_fixed` (arrival order, `max_batch_size` per batch), `token_budget` (arrival order,
  cut when batch x longest would pass `max_batch_tokens`), `length_aware` (the servers' policy).
  Policies run in a rotated order each repetition, so drift in machine load spreads over all.
"""

from __future__ import annotations

import gc
import json
import pathlib
import sys
import time

import numpy as np

from rmscore_tools.workload import make_rollout

BIG = 1 << 40


def _planner_config(policy: str, max_batch_size: int, max_batch_tokens: int):
    from rmscore.core.planner import FIFO, LENGTH_AWARE, PlannerConfig

    return {
        "no_batching": PlannerConfig(1, BIG, 0, FIFO),
        "fifo_fixed": PlannerConfig(max_batch_size, BIG, 0, FIFO),
        "token_budget": PlannerConfig(1 << 20, max_batch_tokens, 0, FIFO),
        "length_aware": PlannerConfig(max_batch_size, max_batch_tokens, 0, LENGTH_AWARE),
    }[policy]


def plan_batches(lengths: list[int], policy: str, max_batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Cut a rollout that arrived all at once into batches (lists of indices), as the planner does."""
    from rmscore.core.planner import Waiting, plan

    cfg = _planner_config(policy, max_batch_size, max_batch_tokens)
    queue = [Waiting(id=i, arrival_us=i, length=int(n)) for i, n in enumerate(lengths)]
    now = len(lengths) + 1
    batches = []
    while queue:
        decision = plan(queue, now, cfg)
        if not decision.batch:
            raise RuntimeError(f"planner chose no batch for {len(queue)} waiting sequences ({policy})")
        chosen = set(decision.batch)
        batches.append(list(decision.batch))
        queue = [w for w in queue if w.id not in chosen]
    return batches


def score_batches(backend, seqs: list[list[int]], batches: list[list[int]], pad_id: int) -> tuple[np.ndarray, float]:
    from rmscore.model.padding import pad_batch

    scores = np.empty(len(seqs), dtype=np.float64)
    start = time.perf_counter()
    for b in batches:
        ids, mask = pad_batch([seqs[i] for i in b], pad_id)
        scores[b] = backend.score(ids, mask)
    return scores, time.perf_counter() - start


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False)


def run(spec: dict) -> dict:
    import onnxruntime
    import torch

    from rmscore.model.repository import load_repo

    s = spec
    repo = load_repo(s["model"])
    out = {"versions": {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__},
           "threads": {"intra_op": s["intra_op_threads"], "inter_op": s["inter_op_threads"]},
           "runtimes": {}, "ablation": None, "parity_scores": {}}
    parity_set = make_rollout(np.random.default_rng([s["seed"], 99]), s["parity_set_size"], _mix(s))
    runtimes = list(s["inproc_runtimes"])
    ablation_rt = s["ablation_backend"] if s["ablation"] else None
    needed = runtimes + ([ablation_rt] if ablation_rt and ablation_rt not in runtimes else [])
    steps = len(runtimes) * s["inproc_repeats"] + (s["ablation_repeats"] * 4 if ablation_rt else 0) + len(needed)
    bar = _progress(steps, "in-process")
    kept = None
    for rt in needed:
        bar.set_postfix_str(f"{rt}: load + warm-up")
        backend, load_s = _load(s, repo, rt)
        bar.update(1)
        out["parity_scores"][rt] = score_batches(backend, parity_set, [[i] for i in range(len(parity_set))],
                                                 repo.pad_token_id)[0].tolist()
        if rt in runtimes:
            out["runtimes"][rt] = {"load_and_warmup_s": load_s, "rollout_size": s["rollout_size"],
                                   "policy": "length_aware", "reps": _runtime_reps(s, backend, rt, repo.pad_token_id,
                                                                                   bar)}
        if rt == ablation_rt:
            kept = backend
        else:
            del backend
            gc.collect()
    if ablation_rt:
        out["ablation"] = {"backend": ablation_rt, "rollout_size": s["ablation_rollout_size"],
                           "max_batch_size": s["max_batch_size"], "max_batch_tokens": s["max_batch_tokens"],
                           "reps": [_ablation_rep(s, kept, rep, repo.pad_token_id, bar)
                                    for rep in range(s["ablation_repeats"])]}
    bar.close()
    return out


def _mix(s: dict):
    from rmscore_tools.workload import LengthMix

    return LengthMix.parse(s["lengths"])


def _load(s: dict, repo, rt: str):
    """The runtime as the servers make it, warmed up on the shapes the timed passes will see; (it, seconds)."""
    from rmscore.core.config import ServeConfig
    from rmscore.runtimes import create

    B, T = s["max_batch_size"], s["max_batch_tokens"]
    cfg = ServeConfig(model=pathlib.Path(s["model"]), backend=rt, intra_op_threads=s["intra_op_threads"],
                      inter_op_threads=s["inter_op_threads"], max_batch_size=B, max_batch_tokens=T)
    t = time.perf_counter()
    backend = create(cfg, repo)
    backend.warmup(B, repo.max_sequence_length)
    # One untimed pass over a rollout-shaped input: the shapes the timed passes will see.
    warm = make_rollout(np.random.default_rng([s["seed"], 98]), min(s["rollout_size"], 64), _mix(s))
    score_batches(backend, warm, plan_batches([len(x) for x in warm], "length_aware", B, T), repo.pad_token_id)
    return backend, time.perf_counter() - t


def _runtime_reps(s: dict, backend, rt: str, pad: int, bar) -> list[dict]:
    reps = []
    for rep in range(s["inproc_repeats"]):
        bar.set_postfix_str(f"{rt} rep {rep + 1}")
        rollout = make_rollout(np.random.default_rng([s["seed"], rep, 7]), s["rollout_size"], _mix(s))
        batches = plan_batches([len(x) for x in rollout], "length_aware", s["max_batch_size"], s["max_batch_tokens"])
        _, elapsed = score_batches(backend, rollout, batches, pad)
        reps.append({"rep": rep, "makespan_s": elapsed, "throughput_seq_s": len(rollout) / elapsed,
                     "batches": len(batches)})
        bar.update(1)
    return reps


def _ablation_rep(s: dict, backend, rep: int, pad: int, bar) -> dict:
    """One repetition of the ablation: the same rollout cut by each policy, in an order rotated by `rep`."""
    policies = ["no_batching", "fifo_fixed", "token_budget", "length_aware"]
    rollout = make_rollout(np.random.default_rng([s["seed"], rep, 11]), s["ablation_rollout_size"], _mix(s))
    lengths = [len(x) for x in rollout]
    order = policies[rep % 4:] + policies[:rep % 4]
    got = {}
    for policy in order:
        bar.set_postfix_str(f"ablation rep {rep + 1}: {policy}")
        batches = plan_batches(lengths, policy, s["max_batch_size"], s["max_batch_tokens"])
        scores, elapsed = score_batches(backend, rollout, batches, pad)
        padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
        got[policy] = (scores, {"makespan_s": elapsed, "throughput_seq_s": len(rollout) / elapsed,
                                "batches": len(batches), "padding_efficiency": sum(lengths) / padded,
                                "mean_batch_size": len(rollout) / len(batches)})
        bar.update(1)
    ref = got["no_batching"][0]
    return {"rep": rep, "order": order, "policies": {
        p: {**m, "max_abs_score_diff_vs_no_batching": float(np.abs(sc - ref).max())} for p, (sc, m) in got.items()}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m rmscore_tools.bench.inproc SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(pathlib.Path(argv[0]).read_text())
    result = run(spec)
    tmp = pathlib.Path(argv[1] + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.rename(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
