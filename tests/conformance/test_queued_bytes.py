"""A bytes budget for accepted work, the same on every kind (issue 29, defect 1; docs/contract.md,
"Order of checks" and --max-queued-request-bytes): a request is held whole from acceptance until it is
answered, so the bytes it holds are counted until then (8 per token id as sent, before truncation), and
one that would take the total past --max-queued-request-bytes is refused RESOURCE_EXHAUSTED at once,
before it is queued. Every accepted request is still answered, and once they are a request fits again.

The budget is held for real: RMSCORE_FAULT_HANG_BATCH stalls the first batch, as a slow model would,
while requests of 64 x 512 ids (truncated to 512, counted 256 KiB each) fill a 2 MiB budget. Before the
budget, the next request was accepted and waited out the stall: issue 29 measured cpp-grpc going from
734 MiB to 5.1 GiB with such requests while admission by work would have gone on accepting."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

import servers
from rmscore_tools.observe import metric

KINDS = servers.frontend_kinds()
BUDGET = 2 << 20
IDS = 64 * 512  # the most one sequence may send (INPUT_FACTOR x max_sequence_length)
HELD = 8 * IDS  # what each counts: 262144 bytes
HOLDERS = BUDGET // HELD  # 8 fill the budget exactly
HANG_S = 10
REFUSED_WITHIN_S = 1.0


@pytest.fixture(scope="module", params=KINDS)
def server(request):
    s = servers.start(request.param, max_queued_request_bytes=BUDGET,
                      env={"RMSCORE_FAULT_HANG_BATCH": f"1:{HANG_S}"})
    yield s
    s.stop()


def big_ids(k: int) -> list[int]:
    return [101] + [1000 + (i + k) % 20000 for i in range(IDS - 2)] + [102]


def score(server, ids: list[int], timeout_s: float) -> tuple[str, str]:
    """One Score call with right truncation on a fresh connection: (code name, score or message)."""
    if server.transport == "http":
        r = httpx.post(server.base_url + "/rmscore/v1/score", timeout=timeout_s + 5,
                       json={"sequences": [{"tokens": ids}], "truncation": "right",
                             "timeout_ms": int(timeout_s * 1000)})
        body = r.json()
        if r.status_code == 200:
            return "OK", str(body["scores"][0])
        return body["error"]["code"], body["error"]["message"]
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    with grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        try:
            r = reward_pb2_grpc.RewardModelStub(ch).Score(reward_pb2.ScoreRequest(
                sequences=[reward_pb2.Sequence(tokens=reward_pb2.TokenIds(ids=ids))],
                truncation=reward_pb2.TRUNCATION_RIGHT), timeout=timeout_s)
        except grpc.RpcError as e:
            return e.code().name, e.details()
        return "OK", str(r.scores[0])


def stream_item(server, ids: list[int], timeout_s: float) -> tuple[str, str]:
    """One ScoreStream item: (code name, score or message) of its answer."""
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    item = reward_pb2.ScoreStreamRequest(id="7", sequence=reward_pb2.Sequence(tokens=reward_pb2.TokenIds(ids=ids)),
                                         truncation=reward_pb2.TRUNCATION_RIGHT)
    with grpc.insecure_channel(server.target) as ch:
        answers = list(reward_pb2_grpc.RewardModelStub(ch).ScoreStream(iter([item]), timeout=timeout_s))
    assert len(answers) == 1 and answers[0].id == "7", answers
    a = answers[0]
    if a.HasField("error"):
        return grpc.StatusCode(next(c for c in grpc.StatusCode if c.value[0] == a.error.code)).name, a.error.message
    return "OK", str(a.score)


def test_requests_past_the_budget_are_refused_at_once_and_every_accepted_one_is_answered(server):
    # No warming call: the hang is armed for the first batch the server runs, the first holder's.
    with ThreadPoolExecutor(HOLDERS) as pool:
        holders = [pool.submit(score, server, big_ids(k), 60) for k in range(HOLDERS)]
        time.sleep(2)  # all accepted, the first batch hung, the rest queued behind it
        assert not any(h.done() for h in holders), [h.result() for h in holders if h.done()]
        # The gauge reads what the budget counts (the name first: a missing metric reads 0).
        assert "rmscore_queued_request_bytes" in server.metrics_text()
        assert metric(server, "rmscore_queued_request_bytes") == BUDGET

        t = time.perf_counter()
        code, message = score(server, big_ids(99), 60)
        took = time.perf_counter() - t
        assert code == "RESOURCE_EXHAUSTED", (code, message)
        assert took < REFUSED_WITHIN_S, took
        assert message == (f"queue full: {BUDGET} bytes of accepted requests held, plus this request's {HELD}, "
                           f"exceeds max_queued_request_bytes {BUDGET}"), message
        # A small request does not fit either: the budget is full.
        code, message = score(server, [101, 2054, 102], 60)
        assert code == "RESOURCE_EXHAUSTED" and "max_queued_request_bytes" in message, (code, message)
        if server.transport == "grpc":
            t = time.perf_counter()
            code, message = stream_item(server, big_ids(98), 60)
            assert code == "RESOURCE_EXHAUSTED" and "max_queued_request_bytes" in message, (code, message)
            assert time.perf_counter() - t < REFUSED_WITHIN_S

        results = [h.result(timeout=HANG_S + 60) for h in holders]
    assert [c for c, _ in results] == ["OK"] * HOLDERS, results
    deadline = time.monotonic() + 5  # C++ gives a Score's bytes back as gRPC frees the call, just after
    while metric(server, "rmscore_queued_request_bytes") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "rmscore_queued_request_bytes") == 0
    # Answered, their bytes are given back: a request of the same size fits again, on each path.
    assert score(server, big_ids(97), 60)[0] == "OK"
    if server.transport == "grpc":
        assert stream_item(server, big_ids(96), 60)[0] == "OK"
