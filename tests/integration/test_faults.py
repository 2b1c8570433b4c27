"""Faults on every server kind but py-grpc-compile (servers.frontend_kinds), as real processes on loopback: overload, cancelling clients, SIGKILL
and restart, SIGTERM drain, and a short soak (rmscore_tools.reliability.faults; docs/hardening.md).

One server per kind serves the tests in file order: overload, cancel and soak share it, the
kill/restart test replaces it with the restarted one, and the drain test ends it. Sizes here are small; `rmscore hardening` runs the report's.
RMSCORE_TEST_KINDS=cpp-grpc,py-http-onnxruntime narrows the kinds (naming py-grpc-compile adds it).
"""

from __future__ import annotations

import pytest

import servers
from rmscore_tools.reliability import faults
KINDS = servers.frontend_kinds()
# A queue small enough that 4x the capacity overflows it within seconds.
FLAGS = dict(max_queue_sequences=128, max_sequences_per_request=128, max_batch_size=16, drain_grace_seconds=60)
SHORT = "lognormal:24:0.4:8:64"
SOAK_KINDS = ("cpp-grpc", "py-grpc-onnxruntime")


class Live:
    """The kind's current server: started on first use, replaced by kill/restart, ended by drain."""

    def __init__(self, kind: str):
        self.kind = kind
        self.server = None

    def get(self):
        if self.server is None or self.server.proc.poll() is not None:
            self.server = faults.start(self.kind, **FLAGS)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop(30)


@pytest.fixture(scope="module", params=KINDS)
def live(request):
    lv = Live(request.param)
    yield lv
    lv.close()


def test_overload_four_times_capacity_every_request_answered_once(live):
    fig = faults.overload(live.get(), seconds=4, factor=4, capacity_seconds=2, concurrency=8, lengths=SHORT)
    summary = {k: v for k, v in fig.items() if k != "refuse_ms_all"}
    assert fig["offered"] > 0 and fig["answered"] == fig["offered"], summary
    assert fig["lost"] == 0, summary
    assert fig["refused"] > 0, summary  # 4x the capacity for seconds must overflow the queue
    assert fig["refuse_ms"]["p99"] < 1000, summary  # refused at once, not after waiting in the queue
    # Accepted work waits at most behind a full queue; the bound is generous for a shared machine.
    assert fig["accepted_ms"]["p99"] < 3 * fig["queue_drain_bound_ms"] + 10_000, summary
    assert fig["served_normally_after"], summary


def test_cancelled_and_vanished_clients_cost_no_model_time(live):
    fig = faults.cancel(live.get(), rounds=3, clients_per_round=4, sequences_per_request=32,
                        lengths="uniform:96:192", cancel_after_s=0.2)
    assert fig["dropped_cancelled"] > 0, fig
    assert fig["scored_sequences"] < 0.5 * fig["offered_sequences"], fig
    assert fig["idle_after_every_round"], fig  # nothing left in flight or queued by a vanished client
    # Catches a runaway leak per vanished client; a young C++ server's ONNX Runtime memory still swings
    # by a quarter as new shapes arrive (27 % seen once on a loaded machine), so not the soak's 5 % goal.
    assert fig["rss_growth_pct"] < 50, fig
    assert fig["golden_after"], fig


def test_soak_runs_and_samples_memory(live):
    if live.kind not in SOAK_KINDS:
        pytest.skip("the short soak runs on " + ", ".join(SOAK_KINDS))
    fig = faults.soak(live.get(), seconds=10, warmup_s=4, sample_every_s=2, concurrency=3, lengths=SHORT)
    assert fig["requests"] > 0 and fig["errors"] == 0, fig
    assert len(fig["samples"]) >= 4, fig
    assert fig["rss_growth_pct"] < 50, fig  # the 5 % goal is the report's; this catches a runaway leak


def test_sigkill_mid_rollout_then_restart_loses_and_duplicates_no_score(live):
    fig, live.server = faults.kill_restart(live.get(), sequences=96, chunk_size=8, max_concurrency=4,
                                           kill_at_fraction=0.3)
    assert fig["killed_mid_run"], fig
    assert fig["same_port"] and fig["killed_exit_code"] == -9, fig
    assert fig["client_error"] is None, fig
    assert fig["chunks_retried"] > 0, fig  # the kill really hit requests in flight
    assert fig["scores"] == fig["sequences"] and fig["chunks_answered_twice"] == 0, fig
    assert fig["complete_unique_correct"], fig


def test_sigterm_not_serving_before_refusing_then_drains(live):
    server = live.get()
    live.server = None  # the drain ends it
    fig = faults.drain(server, in_flight=6, sequences_per_request=12)
    assert fig["all_accepted_answered"] and fig["in_flight_answered_ok"] == 6, fig
    assert fig["not_serving_seen_ms"] is not None and fig["first_refusal_ms"] is not None, fig
    assert fig["health_serving_after_refusal"] == 0 and fig["not_serving_first"], fig
    assert fig["refusal_kinds"].get("UNAVAILABLE: not ready: draining", 0) > 0, fig["refusal_kinds"]
    assert fig["refusals_not_unavailable_before_exit"] == 0, fig["refusal_kinds"]
    assert fig["exit_code"] == 0 and fig["exit_within_grace"], fig
