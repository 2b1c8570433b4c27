"""rmscore bench: the statistics on hand-computed inputs, the batching ablation's batches, and the tiny
preset end to end against real servers (JSON, report, plots)."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from rmscore_tools.bench.inproc import plan_batches
from rmscore_tools.stats import CI, mean_ci, overlaps, percentiles, verdict
from rmscore_tools.bench.summary import summarise
from rmscore_tools.workload import LengthMix, chunks, make_rollout, padding_efficiency

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- statistics -------------------------------------------------------------------------------
def test_mean_ci_five_values_by_hand():
    # mean 3, sd sqrt(2.5) = 1.5811388, t(0.975, df=4) = 2.7764451, half = t * sd / sqrt(5) = 1.9632432
    ci = mean_ci([1, 2, 3, 4, 5])
    assert ci.n == 5
    assert ci.mean == 3
    assert ci.sd == pytest.approx(1.5811388, abs=1e-7)
    assert ci.half_width == pytest.approx(1.9632432, abs=1e-6)
    assert (ci.lo, ci.hi) == (pytest.approx(1.0367568, abs=1e-6), pytest.approx(4.9632432, abs=1e-6))


def test_mean_ci_two_values_uses_t_with_one_degree_of_freedom():
    # sd = sqrt(2), sqrt(n) = sqrt(2): half = t(0.975, 1) = 12.7062047
    ci = mean_ci([10, 12])
    assert ci.half_width == pytest.approx(12.7062047, abs=1e-6)
    assert ci.lo == pytest.approx(11 - 12.7062047, abs=1e-6)


def test_mean_ci_other_confidence_and_missing_values():
    # 90%: t(0.95, 4) = 2.1318468; NaN and None (a repetition without the figure) are dropped.
    ci = mean_ci([1, 2, float("nan"), 3, None, 4, 5], confidence=0.90)
    assert ci.n == 5
    assert ci.half_width == pytest.approx(2.1318468 * 1.5811388 / math.sqrt(5), abs=1e-6)


def test_mean_ci_degenerate_cases():
    one = mean_ci([7.0])
    assert one.n == 1 and one.mean == 7.0 and math.isinf(one.half_width)
    none = mean_ci([])
    assert none.n == 0 and math.isnan(none.mean)
    same = mean_ci([4.0, 4.0, 4.0])
    assert same.half_width == 0 and same.lo == same.hi == 4.0


def test_overlap_verdicts_by_hand():
    # t(0.975, 2) = 4.3026527, sd 1, n 3: half = 2.4841377.
    a = mean_ci([10, 11, 12])   # [8.516, 13.484]
    b = mean_ci([20, 21, 22])   # [18.516, 23.484]
    c = mean_ci([13, 14, 15])   # [11.516, 16.484]
    assert a.hi == pytest.approx(13.4841377, abs=1e-6)
    assert not overlaps(a, b)
    assert verdict(a, b, higher_is_better=True) == "B"
    assert verdict(a, b, higher_is_better=False) == "A"
    assert verdict(b, a, higher_is_better=True) == "A"
    assert overlaps(a, c) and verdict(a, c, True) == "overlap"
    # Closed intervals that touch share a point: overlap.
    assert overlaps(CI(1, 0, 2, 1, 1, 3), CI(3, 2, 4, 1, 1, 3))
    assert not overlaps(CI(1, 0, 1.999, 1, 1, 3), CI(3, 2, 4, 1, 1, 3))
    # One repetition has no interval: never called a difference.
    assert verdict(mean_ci([1.0]), mean_ci([100.0, 101.0]), True) == "overlap"


def test_percentiles_by_hand():
    p = percentiles(list(range(1, 101)))
    # linear interpolation at index q/100 * (n-1): 49.5 -> 50.5, 94.05 -> 95.05, 98.01 -> 99.01
    assert p == {"p50": pytest.approx(50.5), "p95": pytest.approx(95.05), "p99": pytest.approx(99.01)}
    assert all(math.isnan(v) for v in percentiles([]).values())


def test_ci_formatting():
    assert mean_ci([1, 2, 3, 4, 5]).fmt() == "3.00 ± 2.0"
    assert mean_ci([7.0]).fmt() == "7.00 (n=1, no CI)"


# ---- summary over a hand-made record ---------------------------------------------------------
def _session(config: str, rep: int, throughput: float, makespan: float) -> dict:
    closed = {"concurrency": 4, "throughput_seq_s": throughput, "latency_ms": {"p50": 10.0, "p95": 20.0, "p99": 30.0},
              "errors": 0}
    return {"mode": "isolated", "rep": rep, "config": config, "server": {}, "closed": [closed],
            "open": {"throughput_seq_s": 8.0, "latency_ms": {"p50": 1, "p95": 2, "p99": 3}, "errors": 0, "shed": 0},
            "rollout": {"makespan_s_mean": makespan, "errors": 0}}


def test_summary_cis_and_pairwise_verdicts():
    record = {
        "settings": {"concurrency": [4], "modes": ["isolated"]},
        "configs": [{"id": "fast", "backend": "onnxruntime"}, {"id": "slow", "backend": "eager"},
                    {"id": "alike", "backend": "onnxruntime"}],
        "sessions": [_session("fast", r, t, m) for r, (t, m) in enumerate([(20, 1.0), (21, 1.1), (22, 1.2)])]
        + [_session("slow", r, t, m) for r, (t, m) in enumerate([(10, 3.0), (11, 3.1), (12, 3.2)])]
        + [_session("alike", r, t, m) for r, (t, m) in enumerate([(13, 2.0), (14, 2.1), (15, 2.2)])],
        "inproc": None,
    }
    summary = summarise(record)
    fast = summary["servers"]["isolated"]["fast"]["closed.c4.throughput"]
    assert fast["mean"] == 21 and fast["half_width"] == pytest.approx(2.4841377, abs=1e-6)
    pairs = {(p["a"], p["b"]): p for p in summary["pairs"]["isolated"]["closed.c4.throughput"]}
    assert pairs[("fast", "slow")]["verdict"] == "A" and pairs[("fast", "slow")]["better"] == "fast"
    # alike [11.52, 16.48] overlaps slow [8.52, 13.48] but not fast [18.52, 23.48].
    assert pairs[("alike", "slow")]["verdict"] == "overlap"
    assert pairs[("alike", "fast")]["verdict"] == "B" and pairs[("alike", "fast")]["better"] == "fast"
    assert pairs[("alike", "fast")]["ratio_a_over_b"] == pytest.approx(14 / 21)
    mk = {(p["a"], p["b"]): p for p in summary["pairs"]["isolated"]["rollout.makespan"]}
    assert mk[("fast", "slow")]["better"] == "fast"             # lower makespan is better
    assert mk[("alike", "fast")]["better"] == "fast"


# ---- workload and ablation batches ------------------------------------------------------------
def test_length_mix_parse_and_bounds():
    mix = LengthMix.parse("lognormal:160:0.6:32:512")
    x = mix.sample(np.random.default_rng(0), 5000)
    assert x.min() >= 32 and x.max() <= 512
    assert 140 <= np.median(x) <= 180
    assert (x == 512).any()  # the long tail reaches the model's limit
    assert LengthMix.parse("fixed:128").sample(np.random.default_rng(0), 3).tolist() == [128, 128, 128]
    with pytest.raises(ValueError, match="length mix"):
        LengthMix.parse("gaussian:3")
    rollout = make_rollout(np.random.default_rng(1), 10, LengthMix.parse("uniform:8:16"))
    assert all(8 <= len(s) <= 16 and s[0] == 101 and s[-1] == 102 for s in rollout)
    assert [len(c) for c in chunks(rollout, 4)] == [4, 4, 2]


def test_ablation_batches_by_hand():
    lengths = [100, 10, 100, 10]
    assert plan_batches(lengths, "no_batching", 2, 10_000) == [[0], [1], [2], [3]]
    assert plan_batches(lengths, "fifo_fixed", 2, 10_000) == [[0, 1], [2, 3]]
    assert plan_batches(lengths, "token_budget", 2, 200) == [[0, 1], [2, 3]]
    assert plan_batches(lengths, "token_budget", 2, 400) == [[0, 1, 2, 3]]
    # Length-aware: the oldest (100) takes the other 100, then the two 10s go together.
    la = plan_batches(lengths, "length_aware", 2, 10_000)
    assert la == [[0, 2], [1, 3]]
    as_lengths = lambda bs: [[lengths[i] for i in b] for b in bs]  # noqa: E731
    assert padding_efficiency(as_lengths(la)) == 1.0
    assert padding_efficiency(as_lengths([[0, 1], [2, 3]])) == pytest.approx(220 / 400)


# ---- end to end -------------------------------------------------------------------------------
def _bench(out: pathlib.Path, *args: str, timeout: float = 480) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmscore.cli", "bench", "--preset", "tiny", "--out", str(out),
                           "--no-progress", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _png_ok(path: pathlib.Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300
    assert img.std() > 0.01  # not a blank canvas


@pytest.mark.slow
def test_tiny_preset_end_to_end(tmp_path):
    proc = _bench(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "run.json").read_text())
    s = record["settings"]
    assert s["preset"] == "tiny" and s["repeats"] == 2
    sessions = record["sessions"]
    assert [(x["config"], x["rep"]) for x in sessions] == [("py-grpc-onnxruntime/length_aware", 0),
                                                           ("py-grpc-onnxruntime/length_aware", 1)]
    for x in sessions:
        assert not x["server"].get("error"), x["server"]
        assert x["server"]["flags"]["intra_op_threads"] == 2
        assert [c["concurrency"] for c in x["closed"]] == list(s["concurrency"])
        for c in x["closed"]:
            # On a loaded machine a level's window may see no answer; errors are never acceptable.
            assert c["errors"] == 0 and c["cancelled_at_drain"] == 0
            assert len(c["latencies_ms"]) == c["requests"]
            # Answer-to-answer span: never shorter than a round of answers, reported as window_s.
            assert c["throughput_seq_s"] == pytest.approx(c["sequences"] / c["window_s"])
            assert c["window_open_s"] >= s["window_s"]
        assert sum(c["requests"] for c in x["closed"]) >= 1
        assert x["open"]["errors"] == 0 and x["open"]["answered"] >= 1
        assert x["rollout"]["errors"] == 0 and len(x["rollout"]["makespans_s"]) == s["rollouts_per_rep"]
    assert len(sessions[0]["parity_scores"]) == s["parity_set_size"]
    summary = record["summary"]
    fig = summary["servers"]["isolated"]["py-grpc-onnxruntime/length_aware"]["closed.c2.throughput"]
    assert fig["n"] == 2 and math.isfinite(fig["half_width"])
    assert fig["mean"] == pytest.approx(np.mean([x["closed"][1]["throughput_seq_s"] for x in sessions]))
    inproc = record["inproc"]
    assert len(inproc["runtimes"]["onnxruntime"]["reps"]) == 2
    assert set(summary["ablation"]) == {"no_batching", "fifo_fixed", "token_budget", "length_aware"}
    for p, v in summary["ablation"].items():
        assert v["max_abs_score_diff_vs_no_batching"] < 1e-4, p  # batching never changes a score
    assert summary["ablation"]["no_batching"]["padding_efficiency"]["mean"] == 1.0
    report = (tmp_path / "report.md").read_text()
    for heading in ("## Servers, isolated", "### Closed-loop throughput", "### Open loop", "### Rollout makespan",
                    "## In-process runtimes", "## Batching ablation", "intra-op 2, inter-op 1"):
        assert heading in report, heading
    for png in ("throughput_vs_concurrency.png", "latency_distributions.png", "rollout_makespan.png",
                "batching_ablation.png"):
        _png_ok(tmp_path / png)
        assert f"]({png})" in report
    # The report can be rebuilt from the JSON alone.
    (tmp_path / "report.md").unlink()
    again = subprocess.run([sys.executable, "-m", "rmscore.cli", "bench", "--report-only", str(tmp_path / "run.json")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "report.md").read_text() == report


@pytest.mark.slow
def test_tiny_contended_two_servers_at_once(tmp_path):
    proc = _bench(tmp_path, "--kinds", "py-grpc-onnxruntime,py-http-onnxruntime", "--modes", "contended",
                  "--inproc", "none", "--no-ablation")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["inproc"] is None
    sessions = record["sessions"]
    assert len(sessions) == 4 and {x["mode"] for x in sessions} == {"contended"}
    for rep in (0, 1):
        both = [x for x in sessions if x["rep"] == rep]
        assert {x["kind"] for x in both} == {"py-grpc-onnxruntime", "py-http-onnxruntime"}
        # Measured at the same time: the two measurement spans overlap.
        assert max(x["measured_from"] for x in both) < min(x["measured_to"] for x in both)
        for x in both:
            assert all(c["errors"] == 0 and c["requests"] >= 1 for c in x["closed"]), x["config"]
    pairs = record["summary"]["pairs"]["contended"]["rollout.makespan"]
    assert [(p["a"], p["b"]) for p in pairs] == [("py-grpc-onnxruntime/length_aware",
                                                  "py-http-onnxruntime/length_aware")]
    assert pairs[0]["verdict"] in ("overlap", "A", "B")
    assert "## Servers, contended" in (tmp_path / "report.md").read_text()


def test_bad_arguments_are_refused(tmp_path):
    proc = _bench(tmp_path, "--kinds", "py-grpc-nonsense", "--repeats", "0", timeout=60)
    assert proc.returncode != 0
    assert "unknown kind 'py-grpc-nonsense'" in proc.stderr and "--repeats" in proc.stderr


# ---- the study's claims on a hand-made run ----------------------------------------------------
def _claims_record(eager_makespans=(3.0, 3.1, 3.2), eager_throughput=(10, 11, 12)) -> dict:
    sessions = []
    for cid, tps, mks in (("cpp-grpc/length_aware", (20, 21, 22), (1.0, 1.1, 1.2)),
                          ("py-grpc-onnxruntime/length_aware", (20, 21, 22), (1.0, 1.1, 1.2)),
                          ("py-grpc-eager/length_aware", eager_throughput, eager_makespans)):
        for rep, (t, m) in enumerate(zip(tps, mks)):
            x = _session(cid, rep, t, m)
            if rep == 0:
                x["parity_scores"] = [0.1 + 1e-6, 0.2] if cid.startswith("cpp") else [0.1, 0.2]
            sessions.append(x)
    policy = lambda t: {"throughput_seq_s": t, "makespan_s": 100 / t, "padding_efficiency": 1.0, "batches": 4,  # noqa: E731
                        "max_abs_score_diff_vs_no_batching": 0.0}
    return {
        "settings": {"concurrency": [4], "modes": ["isolated"], "batching": ["length_aware"]},
        "configs": [{"id": c, "backend": "x"} for c in ("cpp-grpc/length_aware", "py-grpc-onnxruntime/length_aware",
                                                        "py-grpc-eager/length_aware")],
        "sessions": sessions,
        "inproc": {
            "runtimes": {"onnxruntime": {"reps": [{"throughput_seq_s": t, "makespan_s": 64 / t} for t in (20, 21, 22)]},
                         "eager": {"reps": [{"throughput_seq_s": t, "makespan_s": 64 / t} for t in (10, 11, 12)]}},
            "ablation": {"reps": [{"policies": {"no_batching": policy(a), "fifo_fixed": policy(b)}}
                                  for a, b in ((40, 10), (41, 11), (42, 12))]},
            "parity_scores": {"eager": [0.1, 0.2], "onnxruntime": [0.1, 0.2 + 2e-6]},
        },
    }


def test_study_claims_verdicts():
    from rmscore_tools.bench.report import study_claims

    record = _claims_record()
    claims = {c["claim"]: c["agrees"] for c in study_claims(record, summarise(record))}
    assert claims["C++ ORT matches PyTorch to 5.7e-06"] == "yes"
    assert claims["C++ ORT beats py-grpc-eager (length_aware) with non-overlapping CIs"] == "yes"
    assert claims["the gain comes from ORT, not from C++ (length_aware)"] == "yes"
    # Batching 3.6x (separated) against ORT/eager 1.9x (separated) and C++/Python 1.0x (overlap).
    assert claims["batching strategy matters more than language or runtime"].startswith("yes")

    # Eager overlapping the C++ server: not reproduced (never "refuted" on overlap alone) ...
    record = _claims_record(eager_makespans=(0.5, 1.1, 1.7), eager_throughput=(15, 21, 27))
    claims = {c["claim"]: c["agrees"] for c in study_claims(record, summarise(record))}
    assert claims["C++ ORT beats py-grpc-eager (length_aware) with non-overlapping CIs"].startswith("not reproduced")
    # ... and eager ahead with separated intervals: contradicted.
    record = _claims_record(eager_makespans=(0.5, 0.51, 0.52), eager_throughput=(40, 41, 42))
    claims = {c["claim"]: c["agrees"] for c in study_claims(record, summarise(record))}
    assert claims["C++ ORT beats py-grpc-eager (length_aware) with non-overlapping CIs"].startswith("no")


def test_client_cost_bench_measures_every_client(tmp_path):
    """`rmscore bench --client-cost` at its smallest: every client scored through a real server, each
    compared client with a finite ratio against its bare library, the markdown naming them all."""
    from rmscore_tools.bench import client_cost

    rec = client_cost.run(tmp_path, rounds=2, calls=4)
    assert set(rec["clients"]) == set(client_cost.CLIENTS)
    for name, row in rec["clients"].items():
        assert row["wall_ms"]["n"] == 2 and row["wall_ms"]["mean"] > 0, (name, row)
        assert row["client_cpu_ms"]["mean"] > 0, (name, row)
        if client_cost.CLIENTS[name][1] is not None:
            assert math.isfinite(row["wall_ratio"]["mean"]) and row["wall_ratio"]["mean"] > 0, (name, row)
    md = (tmp_path / "client_cost.md").read_text()
    assert all(f"| {name} |" in md for name in client_cost.CLIENTS), md
    assert json.loads((tmp_path / "client_cost.json").read_text())["calls"] == 4
