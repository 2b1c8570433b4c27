"""py-grpc's ScoreStream answers every item once, even an item whose scoring fails with an error that is
not one of the contract's (a tokenizer's panic, a bug): that item is answered INTERNAL, saying what
failed, and the stream goes on and ends. Before, such an error ended the stream's reader without its
end marker: the items after it were never read and the stream hung until the client's deadline.

The servicer is the server's own, on a real grpc.aio server on 127.0.0.1 over the servers' scoring
core (models/default, not loaded); the fault is injected into the core's `score_item`, the one call
the stream makes per item, which scores the other items as a stand-in model would."""

from __future__ import annotations

import asyncio
import pathlib

import grpc

from rmscore.core.batcher import Result
from rmscore.core.config import ServeConfig
from rmscore.core.scoring import ScoringCore
from rmscore.frontends.grpc_server import RewardModelServicer
from rmscore.runtimes.workers import RUNTIME
from rmscore.v1 import reward_pb2, reward_pb2_grpc

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "default"


def core_failing_on(bad_id: int) -> ScoringCore:
    core = ScoringCore(ServeConfig(model=MODEL), RUNTIME)

    async def score_item(item, truncation, where, deadline_s):
        if bad_id in item.tokens:
            raise RuntimeError("the tokenizer panicked")
        return Result(scores=[float(item.tokens[1])], total_ms=1.0, inference_ms=1.0)
    core.score_item = score_item
    return core


def test_an_item_that_fails_unexpectedly_is_answered_internal_and_the_stream_goes_on():
    async def go():
        server = grpc.aio.server()
        reward_pb2_grpc.add_RewardModelServicer_to_server(RewardModelServicer(core_failing_on(7)), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                items = [reward_pb2.ScoreStreamRequest(id=str(k), sequence=reward_pb2.Sequence(
                    tokens=reward_pb2.TokenIds(ids=[101, k, 102]))) for k in range(5, 10)]
                call = reward_pb2_grpc.RewardModelStub(ch).ScoreStream(iter(items), timeout=10)
                return [a async for a in call]
        finally:
            await server.stop(0)

    answers = asyncio.run(go())
    by_id = {a.id: a for a in answers}
    assert sorted(by_id) == ["5", "6", "7", "8", "9"] and len(answers) == 5, answers
    bad = by_id["7"]
    assert bad.WhichOneof("result") == "error" and bad.error.code == grpc.StatusCode.INTERNAL.value[0]
    assert bad.error.message == "internal error: RuntimeError: the tokenizer panicked"
    assert [by_id[k].score for k in ("5", "6", "8", "9")] == [5.0, 6.0, 8.0, 9.0]
