"""A ScoreStream's items each get an answer of their own before the call's deadline (issue 29: items
still queued when the deadline ended the call had none, 201 of them on cpp-grpc under a flood).

gRPC cancels a call when its deadline passes and an answer written then never reaches the client, so
every kind answers the items it still owes a tenth of the call's time (at most 0.25 s) before it,
DEADLINE_EXCEEDED with its own message, and the call then ends as usual. The work is held up for
real: RMSCORE_FAULT_HANG_BATCH makes the first batch block, one item hangs in it, and the others wait
behind it on the one batcher thread (the test flags' one intra-op thread)."""

from __future__ import annotations

import time

import grpc
import pytest

import servers
from harness import GOLDEN_IDS, pb, pbg

HANG_S = 8
DEADLINE_S = 3.0
MESSAGE = "deadline exceeded before scoring: the stream's deadline is near"


@pytest.fixture(scope="module", params=servers.grpc_kind_per_language())
def server(request):
    s = servers.start(request.param, env={"RMSCORE_FAULT_HANG_BATCH": f"1:{HANG_S}"})
    yield s
    s.stop()


def test_items_still_owed_are_answered_before_the_streams_deadline(server):
    items = [pb.ScoreStreamRequest(id=f"i{i}", sequence=pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[i])))
             for i in range(3)]
    got, at = [], []

    def sent():
        for item in items:
            yield item
            time.sleep(0.05)  # the first one's batch starts (and hangs) before the others arrive

    t0 = time.monotonic()
    with grpc.insecure_channel(server.target) as ch:
        call = pbg.RewardModelStub(ch).ScoreStream(sent(), timeout=DEADLINE_S)
        for answer in call:  # ends with the call: an error here fails the test with its status
            got.append(answer)
            at.append(time.monotonic() - t0)
        assert call.code() == grpc.StatusCode.OK, (call.code(), call.details())
    assert sorted(a.id for a in got) == ["i0", "i1", "i2"], got
    for a in got:
        assert a.WhichOneof("result") == "error" and a.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], a
        assert a.error.message == MESSAGE, a.error.message
    # answered at the margin (0.25 s here), not at once and not after the deadline
    assert DEADLINE_S - 0.25 - 0.2 <= min(at) and max(at) < DEADLINE_S, at


def test_a_stream_with_time_to_spare_is_scored(server):
    """After the hang, a stream's items are scored as usual: the margin takes nothing from a call that
    is answered in time."""
    deadline = time.monotonic() + HANG_S + 10
    while time.monotonic() < deadline:  # the hung batch ends HANG_S after it began
        with grpc.insecure_channel(server.target) as ch:
            try:
                pbg.RewardModelStub(ch).Score(pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[0]))]),
                                              timeout=1)
                break
            except grpc.RpcError:
                time.sleep(0.2)
    items = [pb.ScoreStreamRequest(id=f"j{i}", sequence=pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[i])))
             for i in range(3)]
    with grpc.insecure_channel(server.target) as ch:
        got = list(pbg.RewardModelStub(ch).ScoreStream(iter(items), timeout=DEADLINE_S))
    assert sorted(a.id for a in got) == ["j0", "j1", "j2"] and all(a.WhichOneof("result") == "score" for a in got), got


def test_items_sent_after_the_margin_get_the_same_answer_valid_or_not(server):
    """An item that arrives once the margin has begun is answered the same way on every kind, before it
    is validated (admission before validation, docs/contract.md). Before, cpp-grpc validated it first
    (an empty item got INVALID_ARGUMENT) and refused a valid one with another message."""
    margin_s = 0.25
    late = [pb.ScoreStreamRequest(id="late-empty", sequence=pb.Sequence(tokens=pb.TokenIds(ids=[]))),
            pb.ScoreStreamRequest(id="late-ok", sequence=pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[0])))]

    def sent():
        yield pb.ScoreStreamRequest(id="early", sequence=pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[0])))
        time.sleep(DEADLINE_S - margin_s + 0.05)
        yield from late

    with grpc.insecure_channel(server.target) as ch:
        got = {a.id: a for a in pbg.RewardModelStub(ch).ScoreStream(sent(), timeout=DEADLINE_S)}
    assert got["early"].WhichOneof("result") == "score", got["early"]
    for item in late:
        a = got[item.id]
        assert a.WhichOneof("result") == "error" and a.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], a
        assert a.error.message == MESSAGE, a.error.message
