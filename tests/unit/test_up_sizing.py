"""`rmscore up`'s load sizing: phase 2 must offer loads that keep every queue bounded, and the
phase-1 ramp must stop where a server saturates, not before."""

import math

import pytest

from rmscore_tools.up import sizing

CAPACITIES = {"cpp-grpc": 44.0, "py-grpc-onnxruntime": 30.0, "py-grpc-eager": 12.0, "py-grpc-compile": 15.0,
              "py-http-onnxruntime": 20.0}


@pytest.mark.parametrize("utilization", [0.3, 0.5, 0.8])
@pytest.mark.parametrize("duration_s", [15, 60, 300])
def test_offers_keep_the_shared_machine_below_saturation(utilization, duration_s):
    offers = sizing.contended_offers(CAPACITIES, duration_s, utilization)
    assert set(offers) == set(CAPACITIES)
    # Together the servers share one machine: the offered fractions of each one's capacity add
    # up to the utilization asked for, below 1, so no queue grows without bound.
    assert math.isclose(sum(o.utilization for o in offers.values()), utilization)
    n = len(CAPACITIES)
    sizes = {o.rollout_size for o in offers.values()}
    assert len(sizes) == 1, f"one rollout size for comparable makespans, got {sizes}"
    for o in offers.values():
        # A rollout scored at the server's share of the machine (capacity / n) takes
        # utilization x period: it is done before the next one starts, so at most one rollout
        # per trainer rank is ever queued.
        makespan_at_share = o.rollout_size / (o.capacity_seq_s / n)
        assert makespan_at_share <= utilization * o.period_s * (1 + 1e-9), o
        assert math.isclose(o.rate_seq_s, o.rollout_size / o.period_s)
    slowest = min(offers.values(), key=lambda o: o.rate_seq_s)
    if slowest.rollout_size > 4:  # not clamped at the minimum: several rollouts fit in the phase
        assert duration_s / slowest.period_s >= 6 * (1 - 1e-9)


def test_offers_follow_capacity_not_fixed_numbers():
    small = sizing.contended_offers({"a": 10.0, "b": 20.0}, 60)
    big = sizing.contended_offers({"a": 100.0, "b": 200.0}, 60)
    assert math.isclose(big["a"].rate_seq_s, 10 * small["a"].rate_seq_s)
    assert math.isclose(small["b"].rate_seq_s, 2 * small["a"].rate_seq_s)
    assert big["a"].rollout_size > small["a"].rollout_size


@pytest.mark.parametrize("bad", [{"a": 0.0}, {"a": float("nan")}, {"a": -3.0}, {}])
def test_offers_refuse_unmeasured_capacities(bad):
    with pytest.raises(ValueError) as e:
        sizing.contended_offers(bad, 60)
    if bad:
        assert repr(next(iter(bad.values()))) in str(e.value) or "nan" in str(e.value)


@pytest.mark.parametrize("u", [0.0, 1.0, 1.5])
def test_offers_refuse_a_utilization_that_lets_queues_grow(u):
    with pytest.raises(ValueError, match=str(u)):
        sizing.contended_offers(CAPACITIES, 60, u)


def test_ramp_stops_at_saturation_not_at_one_noisy_level():
    assert sizing.ramp_levels(64) == [1, 2, 4, 8, 16, 32, 64]
    assert sizing.ramp_levels(6) == [1, 2, 4, 6]
    assert not sizing.ramp_finished([10, 9])  # one dip is not saturation
    assert not sizing.ramp_finished([10, 9, 15])
    assert sizing.ramp_finished([10, 18, 19, 18])
    assert sizing.fastest([(1, 10), (2, 18), (4, 19), (8, 18)]) == (4, 19)
    assert sizing.fastest([(1, 19), (2, 18), (4, 19)]) == (1, 19)  # a tie: fewer in flight
    assert sizing.fastest([(1, float("nan")), (2, 5)]) == (2, 5)


def test_ramp_points_average_both_passes():
    up = [{"concurrency": 1, "throughput": 10.0, "errors": 0}, {"concurrency": 2, "throughput": 12.0, "errors": 1},
          {"concurrency": 4, "throughput": 9.0, "errors": 0}]
    down = [{"concurrency": 4, "throughput": 11.0, "errors": 2}, {"concurrency": 2, "throughput": 14.0, "errors": 0}]
    pts = sizing.ramp_points(up, down)
    assert [p["throughput"] for p in pts] == [10.0, 13.0, 10.0]  # level 1 was not measured on the way down
    assert [p["windows"] for p in pts] == [[10.0], [12.0, 14.0], [9.0, 11.0]]
    assert [p["errors"] for p in pts] == [0, 1, 2]
    assert sizing.ramp_points(up[:1], [{"concurrency": 1, "throughput": float("nan")}])[0]["throughput"] == 10.0


def test_window_holds_enough_answers():
    assert sizing.window_seconds(100) == 2.0
    assert sizing.window_seconds(25) == 4.0
    assert sizing.window_seconds(40) == 2.5
    assert sizing.window_seconds(5) == 4.0
