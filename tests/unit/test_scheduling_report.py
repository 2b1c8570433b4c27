"""`rmscore bench --scheduling`'s arithmetic, without servers: the in-process plans it times, and the
ratios it reports (each server against the best plan of its own runtime in the same repetition)."""

import pytest

from rmscore_tools.bench import scheduling
from rmscore_tools.bench.plans import plan


def test_plans_are_arrival_order_for_one_and_sorted_cuts_otherwise():
    lengths = [30, 10, 20, 40, 10]
    assert plan(lengths, 1) == [[0], [1], [2], [3], [4]]
    assert plan(lengths, 2) == [[1, 4], [2, 0], [3]]


def _rep(rep, best, served):
    loads = {f"c{c}": {"throughput_seq_s": served, "latency_ms": {"p50": 10.0 + rep, "p99": 100.0}, "errors": 0}
             for c in scheduling.CONCURRENCY}
    loads["rollout"] = {"throughput_seq_s": served, "makespan_s": 1.0, "errors": 0}
    http = {k: dict(v, latency_ms={"p50": v["latency_ms"]["p50"] + 2, "p99": 100.0}) if k == "c1" else v
            for k, v in loads.items()}
    return {"rep": rep, "plans": {"onnxruntime": {"best_seq_s": best, "throughput_seq_s": {"1": best, "8": best / 2}}},
            "servers": {"py-grpc-onnxruntime cost_aware:1": dict(loads, workers_line=""),
                        "py-http-onnxruntime cost_aware:1": dict(http, workers_line="")}}


def test_ratios_are_taken_within_each_repetition():
    # The machine got twice as fast in rep 2: the ratio, taken per repetition, does not move.
    reps = [_rep(0, 40.0, 38.0), _rep(1, 80.0, 76.0)]
    sm = scheduling.summarise(reps, ["py-grpc-onnxruntime", "py-http-onnxruntime"], ["cost_aware:1"])
    row = sm["rows"]["py-grpc-onnxruntime cost_aware:1 c64"]
    assert row["ratio"]["mean"] == pytest.approx(0.95) and row["ratio"]["half_width"] == pytest.approx(0)
    assert row["throughput"]["mean"] == pytest.approx(57.0)
    assert row["p99_bound_ms"]["mean"] == pytest.approx(1.5 * 64 / 57.0 * 1e3, rel=0.2)
    assert sm["http_excess_ms"]["cost_aware:1"]["mean"] == pytest.approx(2.0)
    # The goals, each a ratio within a repetition: batch 1 at c1, T(C)/T(1) under load, the makespan.
    assert sm["rows"]["py-grpc-onnxruntime cost_aware:1 c1"]["batch1_ratio"]["mean"] == pytest.approx(0.95)
    assert sm["rows"]["py-grpc-onnxruntime cost_aware:1 c8"]["over_c1"]["mean"] == pytest.approx(1.0)
    rollout = sm["rows"]["py-grpc-onnxruntime cost_aware:1 rollout"]["makespan_factor"]
    assert rollout["mean"] == pytest.approx((1.0 / (64 / 40) + 1.0 / (64 / 80)) / 2)
    text = scheduling.markdown({"summary": sm, "when": "now", "repeats": 2, "window_s": 5, "threads": 2, "reps": reps,
                                "kinds": ["py-grpc-onnxruntime", "py-http-onnxruntime"],
                                "machine": {"cpu": "AMD EPYC", "cores": 2, "commit": "0123456789abcdef"}})
    assert "| py-grpc-onnxruntime | cost_aware:1 | c64 | 57.0 ± " in text
    # The figures say which machine gave them (the winner differs between CPUs).
    assert "Machine: AMD EPYC, 2 cores; commit 0123456789ab." in text


def test_each_server_is_held_to_the_plans_measured_right_before_it():
    # The repetition's first bar was measured when the machine was slower: a server with its own bar
    # (recorded since 2026-12-06) is held to that one; a run recorded before keeps the repetition's.
    reps = [_rep(0, 40.0, 38.0), _rep(1, 40.0, 38.0)]
    for r in reps:
        r["servers"]["py-grpc-onnxruntime cost_aware:1"]["plans"] = {
            "best_seq_s": 50.0, "throughput_seq_s": {"1": 40.0, "8": 50.0}}
    sm = scheduling.summarise(reps, ["py-grpc-onnxruntime", "py-http-onnxruntime"], ["cost_aware:1"])
    own = sm["rows"]["py-grpc-onnxruntime cost_aware:1 c64"]["ratio"]["mean"]
    assert own == pytest.approx(38.0 / 50.0)
    assert sm["rows"]["py-grpc-onnxruntime cost_aware:1 rollout"]["makespan_factor"]["mean"] == pytest.approx(
        1.0 / (64 / 50.0))
    assert sm["rows"]["py-grpc-onnxruntime cost_aware:1 c1"]["batch1_ratio"]["mean"] == pytest.approx(38.0 / 40.0)
    assert sm["rows"]["py-http-onnxruntime cost_aware:1 c64"]["ratio"]["mean"] == pytest.approx(38.0 / 40.0)


def test_cpu_figures_are_reported_when_recorded():
    reps = [_rep(0, 40.0, 38.0), _rep(1, 80.0, 76.0)]
    for r in reps:
        for load in r["servers"]["py-grpc-onnxruntime cost_aware:1"].values():
            if isinstance(load, dict):
                load.update(client_cpu_ms_per_seq=1.5, server_cpu_ms_per_seq=20.0, client_cpu_share=0.06)
    sm = scheduling.summarise(reps, ["py-grpc-onnxruntime", "py-http-onnxruntime"], ["cost_aware:1"])
    assert sm["rows"]["py-grpc-onnxruntime cost_aware:1 c64"]["client_cpu_share"]["mean"] == pytest.approx(0.06)
    assert "client_cpu_share" not in sm["rows"]["py-http-onnxruntime cost_aware:1 c1"]  # not recorded there
    text = scheduling.markdown({"summary": sm, "when": "now", "repeats": 2, "window_s": 5, "threads": 2, "reps": reps,
                                "kinds": ["py-grpc-onnxruntime", "py-http-onnxruntime"]})
    assert "| 1.50 ± 0, 20.0 ± 0 (0.060 ± 0) |" in text


def test_the_cpu_clock_counts_this_process_as_the_client_and_the_pid_as_the_server():
    import os
    import time
    import types

    me = types.SimpleNamespace(proc=types.SimpleNamespace(pid=os.getpid()))
    clock = scheduling.CpuClock(me)
    end = time.process_time() + 0.3
    while time.process_time() < end:  # burn CPU on this thread: both clocks see it
        pass
    fig = clock.figures(sequences=10)
    assert fig["client_cpu_ms_per_seq"] == pytest.approx(30.0, abs=5.0)
    assert fig["server_cpu_ms_per_seq"] == pytest.approx(fig["client_cpu_ms_per_seq"], abs=3.0)  # 10 ms ticks
    assert 0 < fig["client_cpu_share"] <= 1.0


def test_where_the_time_goes_splits_one_in_flight_between_the_caller_the_server_and_the_model():
    # 40 seq/s at one in flight is 25 ms a request; the server answered in 20 of them, of which the model
    # ran 19, against 16 ms a sequence for batch 1 in-process (62.5 seq/s): 5 ms outside the server, and
    # runs 19 / 16 as long as back to back.
    reps = [_rep(0, 62.5, 40.0), _rep(1, 62.5, 40.0)]
    for r in reps:
        for load in r["servers"]["py-grpc-onnxruntime cost_aware:1"]:
            if load.startswith("c") or load == "rollout":
                r["servers"]["py-grpc-onnxruntime cost_aware:1"][load].update(
                    server_ms_per_request=20.0, model_ms_per_seq=19.0, mean_batch=1.0)
    sm = scheduling.summarise(reps, ["py-grpc-onnxruntime", "py-http-onnxruntime"], ["cost_aware:1"])
    c1 = sm["rows"]["py-grpc-onnxruntime cost_aware:1 c1"]
    assert c1["outside_ms"]["mean"] == pytest.approx(5.0)
    assert c1["model_over_batch1"]["mean"] == pytest.approx(19.0 / 16.0)
    # With 64 in flight a closed loop's request takes 64 / throughput.
    assert sm["rows"]["py-grpc-onnxruntime cost_aware:1 c64"]["outside_ms"]["mean"] == pytest.approx(64e3 / 40 - 20)
    assert "outside_ms" not in sm["rows"]["py-grpc-onnxruntime cost_aware:1 rollout"]
    # Runs recorded before the metrics were (the HTTP server's here) get no such figures, and no row.
    assert "model_ms_per_seq" not in sm["rows"]["py-http-onnxruntime cost_aware:1 c1"]
    text = scheduling.markdown({"summary": sm, "when": "now", "repeats": 2, "window_s": 5, "threads": 2, "reps": reps,
                                "kinds": ["py-grpc-onnxruntime", "py-http-onnxruntime"]})
    assert "| py-grpc-onnxruntime | cost_aware:1 | c1 | 20.0 ± 0 | 5.00 ± 0 | 19.0 ± 0 | 1.00 ± 0 | 1.19 ± 0 |" in text
    assert "| py-http-onnxruntime | cost_aware:1 | c1 | " not in text.split("## Where the time goes")[1]


def test_server_times_read_metrics_every_server_exports():
    # The one definition of the metrics (every kind builds its own from it): a renamed metric would make
    # every figure NaN, silently.
    import json
    import pathlib
    import types

    root = pathlib.Path(__file__).resolve().parents[2]
    defined = {m["name"]: m["type"] for m in json.loads(
        (root / "server_py/rmscore/core/metrics.json").read_text())["metrics"]}
    for name in scheduling.ServerTimes.NAMES:
        base = name.removesuffix("_sum").removesuffix("_count")
        assert defined.get(base) == ("counter" if base == name else "histogram"), name
    # Two scrapes, the second after 4 requests (2 batches of 2, 0.05 s each) answered in 0.1 s each.
    scrapes = iter([
        'rmscore_request_latency_seconds_sum{server="py-grpc"} 1.0\nrmscore_request_latency_seconds_count{server="py-grpc"} 10\n'
        'rmscore_batch_inference_seconds_sum 0.5\nrmscore_sequences_scored_total 10\n'
        'rmscore_batch_size_sum 10\nrmscore_batch_size_count 10\n',
        'rmscore_request_latency_seconds_sum{server="py-grpc"} 1.4\nrmscore_request_latency_seconds_count{server="py-grpc"} 14\n'
        'rmscore_batch_inference_seconds_sum 0.6\nrmscore_sequences_scored_total 14\n'
        'rmscore_batch_size_sum 14\nrmscore_batch_size_count 12\n'])
    times = scheduling.ServerTimes(types.SimpleNamespace(metrics_text=lambda: next(scrapes)))
    fig = times.figures()
    assert fig["server_ms_per_request"] == pytest.approx(100.0)
    assert fig["model_ms_per_seq"] == pytest.approx(25.0)
    assert fig["mean_batch"] == pytest.approx(2.0)
