"""Callers served in turn, and admitted by their own share of the work (issue 29, defect 4; docs/contract.md,
"Shares per caller"): the batcher ranks each sequence by its caller's work so far, so a caller with
nothing queued goes to the head of the line whatever another caller holds (and the head moves as turns are
served, so a long sequence is not passed for ever), and admission counts the
work ahead of *this* caller, so a caller that floods is refused for its own work while others are
accepted. The stand-in model and its gate are test_batcher.py's. Each case has a namesake in
server_cpp/tests/test_batcher.cc (FairShare*)."""

from __future__ import annotations

import time

from rmscore.core.admission import QueueWork
from rmscore.core.errors import Code
from rmscore.core.planner import QueueIndex, Waiting
from rmscore.core.batcher import Job

from test_batcher import Harness, Submitted


def submit_as(h: Harness, caller: str, ids: list[list[int]], deadline_s: float | None = None) -> Submitted:
    s = Submitted(ids, deadline_s)
    s.job = Job(ids, deadline_s, s._done, caller)
    try:
        h.batcher.submit(s.job)
    except Exception as e:  # noqa: BLE001 - the refusal is what the test reads
        s.admitted = e
    return s


def test_a_new_caller_runs_next_whatever_a_flooding_caller_has_queued():
    h = Harness(max_batch_size=1)
    h.gated = True
    flood = [submit_as(h, "a", [[i] * 8]) for i in range(1, 7)]
    assert h.gate.wait_entered(1)  # 1 runs, 2..6 wait
    probe = submit_as(h, "b", [[50] * 8])
    h.gate.open()
    assert probe.get().scores == [50008]
    assert [s.get().scores[0] // 1000 for s in flood] == [1, 2, 3, 4, 5, 6]
    # The probe ran right after the batch that was running, before the flood's queue.
    assert h.batches == [[1], [50], [2], [3], [4], [5], [6]]
    h.batcher.stop()


def test_callers_with_work_queued_take_turns_by_tokens():
    h = Harness(max_batch_size=1)
    h.gated = True
    first = submit_as(h, "a", [[1] * 10])
    assert h.gate.wait_entered(1)
    a = submit_as(h, "a", [[2] * 10, [3] * 10, [4] * 10, [5] * 10])
    b = submit_as(h, "b", [[20] * 20, [21] * 20])  # twice as long: one of b's to two of a's
    h.gate.open()
    for s in (first, a, b):
        s.get()
    # Turns end at a: 20, 30, 40, 50 and b: 20, 40 (b starts at the head, 0, where a's first began):
    # ties by arrival, so one of b's runs per two of a's.
    assert h.batches == [[1], [2], [20], [3], [4], [21], [5]]
    h.batcher.stop()


def test_a_long_sequence_waits_for_its_turns_worth_of_new_callers_not_for_ever():
    # A client opening a connection per request is a new caller every time. A 100-token sequence queued,
    # then one 10-token newcomer per batch, each arriving while the one before runs: each batch moves the
    # head on by its 10 tokens over the callers sharing it (the long one's, and the newcomers' whose turns
    # end past the head: GPS would still be serving them), so the long one runs once the newcomers' turns
    # reach the end of its own, after 44 of them. That is a server kept full by newcomers; GPS would
    # serve the long one beside them. With the head held at the long one's start (until the afternoon of
    # 2026-12-06) every newcomer ranked before it for as long as they came.
    h = Harness(max_batch_size=1)
    h.gated = True
    running = submit_as(h, "r", [[1] * 10])
    assert h.gate.wait_entered(1)
    long = submit_as(h, "x", [[2] * 100])
    newcomers = []
    for k in range(1, 61):
        newcomers.append(submit_as(h, f"n{k}", [[100 + k] * 10]))
        h.gate.release()
        assert h.gate.wait_entered(k + 1)  # the batch after the one released has started
    h.gate.open()
    for s in (running, long, *newcomers):
        s.get()
    assert h.batches == [[1], *([100 + k] for k in range(1, 45)), [2], *([100 + k] for k in range(45, 61))]
    h.batcher.stop()


def test_one_caller_keeps_arrival_order():
    h = Harness(max_batch_size=1)
    h.gated = True
    jobs = [submit_as(h, "a", [[i] * (40 - i)]) for i in range(1, 6)]
    assert h.gate.wait_entered(1)
    h.gate.open()
    for s in jobs:
        s.get()
    assert h.batches == [[1], [2], [3], [4], [5]]
    h.batcher.stop()


def test_a_flooding_caller_is_refused_for_its_own_work_while_another_is_accepted():
    # 100 us per token, a 1 s bound: the work each caller would wait for is known exactly.
    h = Harness(max_batch_size=1, max_wait_us=1_000_000, seed=100.0)
    h.gated = True
    running = submit_as(h, "a", [[1] * 10])
    assert h.gate.wait_entered(1)  # 1 ms running
    held = submit_as(h, "a", [[2] * 12000])  # 1.2 s of a's own work queued: over the bound for a
    assert held.admitted is None  # only the work ahead counted when it came: 1 ms
    more = submit_as(h, "a", [[3]])
    assert more.admitted.code == Code.RESOURCE_EXHAUSTED
    assert more.admitted.message == ("queue full: about 1201 ms of model work waiting exceeds "
                                     "max_queue_wait_seconds (1000 ms)")
    assert h.batcher.work_refusal(None, "a").message == more.admitted.message
    # Another caller waits for the batch running only: accepted, even with a deadline of 0.1 s.
    assert h.batcher.work_refusal(time.monotonic() + 0.1, "b") is None
    probe = submit_as(h, "b", [[4] * 5], time.monotonic() + 0.1)
    assert probe.admitted is None
    # The gauge still reads all the work queued and running.
    assert h.read("rmscore_queue_expected_wait_seconds") == 1.2015
    h.gate.open()
    assert [s.get().scores for s in (running, probe, held)] == [[1010], [4005], [14000]]
    assert h.batches == [[1], [4], [2]]
    h.batcher.stop()


def five_tied_at_the_head() -> tuple[Harness, Submitted, list[Submitted]]:
    """One worker inside a 10-token batch (1 ms at 100 us a token) of caller "a", held until
    `h.gate.open()`, and callers "b" to "f" each with one 2,000-token sequence queued, whose turns all
    start at the head: (harness, the running one, the five)."""
    h = Harness(max_batch_size=1, max_wait_us=2_000_000, seed=100.0)
    h.gated = True
    running = submit_as(h, "a", [[1] * 10])
    assert h.gate.wait_entered(1)
    tied = [submit_as(h, c, [[k] * 2000]) for k, c in enumerate("bcdef", start=2)]
    assert all(s.admitted is None for s in tied)
    return h, running, tied


def test_a_new_callers_short_sequence_runs_before_long_ones_tied_at_the_head():
    # Five callers, each with one 2,000-token sequence whose turn starts at the head (every one of them
    # new): a sixth caller's 5-token sequence starts there too but its turn ends first, so it runs next
    # and only the running batch (1 ms) is ahead of it. Ranked by their turns' starts, it waited for all
    # five (1 s of work): 80 connections streaming 512-token items refused every probe for the whole
    # attack (docs/bench/attacks_2026-12-06.md, streams_80_conns).
    h, running, tied = five_tied_at_the_head()
    assert h.batcher.work_refusal(time.monotonic() + 0.1, "g") is None
    probe = submit_as(h, "g", [[9] * 5], time.monotonic() + 0.1)
    assert probe.admitted is None
    # A sequence of the new caller whose turn would end after theirs waits for all five, and is told so.
    long = submit_as(h, "h", [[8] * 3000], time.monotonic() + 0.5)
    assert long.admitted.code == Code.DEADLINE_EXCEEDED
    assert long.admitted.message.startswith("deadline exceeded before scoring: about 1001 ms of model work waiting")
    h.gate.open()
    for s in (running, *tied, probe):
        s.get()
    assert h.batches == [[1], [9], [2], [3], [4], [5], [6]]
    h.batcher.stop()


def test_a_requests_deadline_is_held_to_its_last_sequence():
    # Five callers, each with one 2,000-token sequence tied at the head. A new caller's request of four
    # 500-token sequences: its first ends its turn before theirs (only the running 1 ms is ahead), but
    # its last ends it with theirs, after all five (1 s) and its own three before it (0.15 s). Held to its
    # first, it was accepted under a 0.5 s deadline and expired in the queue: a flood of 80 callers
    # sending 16 sequences each had none of 135 requests answered (streams_80_conns on py-http).
    h, running, tied = five_tied_at_the_head()
    four = [[7] * 500] * 4
    refused = submit_as(h, "g", four, time.monotonic() + 0.5)
    assert refused.admitted.code == Code.DEADLINE_EXCEEDED
    assert refused.admitted.message.startswith(
        "deadline exceeded before scoring: about 1151 ms of model work before its last sequence (its own earlier "
        "sequences included) and up to 50 ms for that sequence's batch, "), refused.admitted.message
    one = submit_as(h, "g", four[:1], time.monotonic() + 0.5)  # one sequence: only the running batch ahead
    assert one.admitted is None
    accepted = submit_as(h, "h", four, time.monotonic() + 5)
    assert accepted.admitted is None
    h.gate.open()
    for s in (running, *tied, one, accepted):
        s.get()
    h.batcher.stop()


def test_a_deadline_leaves_time_for_the_requests_own_batch_padded_to_the_queues_longest():
    # Batches of 2: a 5-token probe runs before the queued 2,000-token sequence (its turn ends first) but
    # may run beside it, padded to it, so its own batch is up to 2 x 2,000 tokens (0.4 s at 100 us per
    # token) on top of the 1 ms running.
    h = Harness(max_batch_size=2, max_wait_us=2_000_000, seed=100.0)
    h.gated = True
    running = submit_as(h, "a", [[1] * 10])
    assert h.gate.wait_entered(1)
    queued = submit_as(h, "b", [[2] * 2000])
    refused = submit_as(h, "c", [[3] * 5], time.monotonic() + 0.3)
    assert refused.admitted.code == Code.DEADLINE_EXCEEDED
    assert refused.admitted.message.startswith(
        "deadline exceeded before scoring: about 1 ms of model work waiting and up to 400 ms for its own batch")
    accepted = submit_as(h, "c", [[3] * 5], time.monotonic() + 5)
    assert accepted.admitted is None
    h.gate.open()
    for s in (running, queued, accepted):
        s.get()
    h.batcher.stop()


def test_queue_index_tokens_through_sums_the_sequences_ranked_at_or_before():
    index = QueueIndex()
    index.add(Waiting(1, 0, 8), 10)
    index.add(Waiting(2, 0, 30), 20)
    index.add(Waiting(3, 5, 5), 10)
    assert [index.tokens_through(r) for r in (9, 10, 19, 20, 10**9)] == [0, 13, 13, 43, 43]
    index.remove(1)
    assert index.tokens_through(10) == 5


def test_queue_work_waits_for_the_running_batches_and_the_tokens_ahead():
    w = QueueWork(workers=2, max_wait_us=0, seed_us_per_token=10.0)
    w.add(1000, "a")
    w.add(300, "b")
    w.batch_started(100)
    assert w.wait_us(0) == 100 * 10 // 2
    assert w.wait_us(300) == 400 * 10 // 2
    assert w.wait_us() == 1400 * 10 // 2  # None: everything (the gauge)
    w.remove(300, "b")
    assert "b" not in w.by_caller


def test_queue_index_orders_by_rank_then_id():
    index = QueueIndex()
    index.add(Waiting(1, 0, 8), 10)
    index.add(Waiting(2, 0, 8), 20)
    index.add(Waiting(3, 5, 8), 10)  # a later arrival ranked with the head: after it, before 2
    index.add(Waiting(4, 6, 8), 0)
    assert [w.id for w in index.in_arrival()] == [4, 1, 3, 2]
    assert index.oldest().id == 4 and index.first_rank() == 0
    index.remove(4)
    assert index.oldest().id == 1
