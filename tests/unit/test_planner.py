"""The Python planner against the shared batching vectors (the C++ planner runs the same file)."""

import json
import pathlib

import pytest

from rmscore.core.cost import CostTable
from rmscore.core.planner import PlannerConfig, Waiting, plan

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "contract" / "batching_vectors.json").read_text())
CASES = VECTORS["hand"] + VECTORS["generated"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_planner_matches_vector(case):
    c = case["config"]
    cfg = PlannerConfig(c["max_batch_size"], c["max_batch_tokens"], c["max_queue_delay_us"], c["mode"], c["max_batch_us"])
    table = CostTable.from_json(c["cost_table"]) if "cost_table" in c else None
    d = plan([Waiting(**w) for w in case["waiting"]], case["now_us"], cfg, table, c["us_per_token"], c["arrivals_per_s"])
    assert (d.expired, d.batch, d.wait_us) == (
        case["expect"]["expired"], case["expect"]["batch"], case["expect"]["wait_us"])


def test_oldest_always_in_batch_when_dispatching():
    for case in CASES:
        c = case["config"]
        live = [w for w in case["waiting"] if w["deadline_us"] is None or w["deadline_us"] > case["now_us"]]
        if case["expect"]["batch"]:
            assert live[0]["id"] in case["expect"]["batch"], case["name"]
            longest = max(w["length"] for w in live if w["id"] in case["expect"]["batch"])
            n = len(case["expect"]["batch"])
            assert n <= c["max_batch_size"]
            assert n == 1 or n * longest <= c["max_batch_tokens"]


def test_a_batch_of_several_ends_before_its_earliest_deadline():
    """With a rate, every batch of more than one sequence is predicted to end in time, and some
    timed cases are cut by it (else the vectors would not exercise the rule)."""
    cut = 0
    for case in CASES:
        c, batch = case["config"], case["expect"]["batch"]
        if c["us_per_token"] <= 0 or len(batch) < 2:
            continue
        members = [w for w in case["waiting"] if w["id"] in batch]
        deadlines = [w["deadline_us"] for w in members if w["deadline_us"] is not None]
        if deadlines:
            took_us = len(batch) * max(w["length"] for w in members) * c["us_per_token"]
            assert took_us <= min(deadlines) - case["now_us"], case["name"]
    for case in CASES:
        c = case["config"]
        if c["us_per_token"] > 0 and case["expect"]["batch"]:
            untimed = plan([Waiting(**w) for w in case["waiting"]], case["now_us"],
                           PlannerConfig(c["max_batch_size"], c["max_batch_tokens"], c["max_queue_delay_us"], c["mode"]),
                           CostTable.from_json(c["cost_table"]) if "cost_table" in c else None)
            cut += len(untimed.batch) > len(case["expect"]["batch"])
    assert cut >= 10, cut


def test_a_batch_of_several_stays_within_the_batch_time_bound():
    """With a rate and a bound, every batch of more than one sequence is expected to take at most the
    bound, and some capped cases are cut by it."""
    cut = 0
    for case in CASES:
        c, batch = case["config"], case["expect"]["batch"]
        if c["us_per_token"] <= 0 or c["max_batch_us"] <= 0 or not batch:
            continue
        members = [w for w in case["waiting"] if w["id"] in batch]
        if len(batch) > 1:
            assert len(batch) * max(w["length"] for w in members) * c["us_per_token"] <= c["max_batch_us"], case["name"]
        unbounded = plan([Waiting(**w) for w in case["waiting"]], case["now_us"],
                         PlannerConfig(c["max_batch_size"], c["max_batch_tokens"], c["max_queue_delay_us"], c["mode"]),
                         CostTable.from_json(c["cost_table"]) if "cost_table" in c else None, c["us_per_token"],
                         c["arrivals_per_s"])
        cut += len(unbounded.batch) > len(batch)
    assert cut >= 10, cut


@pytest.mark.parametrize("entry", VECTORS["cost_tables"], ids=["cpu-like", "gpu-like", "noisy"])
def test_cost_table_matches_vector(entry):
    table = CostTable.from_json(entry["table"])
    assert [[b, n, table.batch_us(b, n)] for b, n, _ in entry["queries"]] == entry["queries"]


@pytest.mark.parametrize("case", VECTORS["admission"], ids=[c["name"] for c in VECTORS["admission"]])
def test_admission_matches_vector(case):
    from rmscore.core.admission import QueueWork

    w = QueueWork(case["workers"], case["max_wait_us"], case["seed_us_per_token"], case["max_batch_us"])
    for batch_us, n in case["observe"]:
        w.observe(batch_us, n)
    w.add(case["tokens"])
    w.batch_started(case.get("running", 0))
    r = w.refusal(case["now_us"], case["deadline_us"], None, case["own_batch_tokens"], case["queued_before_last"])
    got = {"code": "OK" if r is None else r.code.name, "message": "" if r is None else r.message, "wait_us": w.wait_us()}
    assert got == case["expect"]
    w.remove(case["tokens"])
    w.batch_ended(case.get("running", 0))
    assert w.wait_us() == 0 and w.refusal(case["now_us"], case["deadline_us"]) is None  # empty again: accepted


@pytest.mark.parametrize("mode", ["fifo", "length_aware", "cost_aware"])
def test_an_index_kept_through_adds_and_removes_decides_as_the_list_does(mode):
    """The batcher keeps a QueueIndex as sequences come and go; every decision on it must be the
    reference's on the same queue rebuilt as a list (which the shared vectors hold)."""
    import random

    from rmscore.core.planner import QueueIndex, plan_live

    rng = random.Random(7)
    table = CostTable.from_json(VECTORS["cost_tables"][0]["table"])
    cfg = PlannerConfig(8, 2048, 500, mode)
    index, queue, next_id, now = QueueIndex(), [], 1, 0
    for step in range(600):
        now += rng.randint(0, 300)
        if queue and rng.random() < 0.4:
            gone = rng.choice(queue)  # a cancel, or a sequence taken by a batch
            queue.remove(gone)
            assert index.remove(gone.id) == gone
        else:
            deadline = None if rng.random() < 0.5 else now + rng.randint(0, 5000)
            w = Waiting(next_id, now, rng.choice([4, 16, 16, 100, 300, 512]), deadline)
            queue.append(w)
            index.add(w, next_id)
            next_id += 1
        rate = rng.choice([0.0, 2.0])  # deadlines cut batches only with a rate
        arrivals = rng.choice([0.0, 100.0, 5000.0])  # waits become dispatches when no partner is expected
        reference = plan(queue, now, cfg, table, rate, arrivals)
        assert sorted(index.expired(now)) == sorted(reference.expired)
        for seq_id in reference.expired:  # the batcher fails these before it plans
            queue.remove(index.remove(seq_id))
        live = plan_live(index, now, cfg, table, rate, arrivals)
        assert (live.batch, live.wait_us) == (reference.batch, reference.wait_us), step


def test_the_arrival_rate_reads_a_steady_rate_as_itself_and_decays_when_idle():
    from rmscore.core.planner import ArrivalRate

    r = ArrivalRate()
    assert r.per_s(0) == 0.0  # nothing seen: unknown, so the planner waits as configured
    for t in range(0, 2_000_000, 10_000):  # 100 sequences a second for 2 s
        r.add(1, t)
    assert 95 < r.per_s(2_000_000) < 105
    assert r.per_s(3_000_000) < 1  # a second idle: no partner expected any more
    r.add(8, 3_000_000)  # a burst shows at once
    assert r.per_s(3_000_000) > 40
