"""ScoringCore's parts path (`_score_in_parts`: OpenRLHF's whole rollout batch in one /get_reward, vLLM's
batch routes): when the request fails or its caller goes while its parts are being queued, every part
already queued is dropped before the model sees it. The servers' own core over models/default (never
loaded), on test_batcher's gated stand-in model, which holds the batcher's one worker busy so the parts
stay queued."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from rmscore.core.config import ServeConfig
from rmscore.core.errors import Code, ScoreError
from rmscore.core.scoring import ScoringCore
from rmscore.core.validation import SeqInput
from rmscore.runtimes.workers import RUNTIME
from test_batcher import Harness, submit

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "default"
PART = 2  # max_sequences_per_request: 4 items are 2 parts


def core_on(h: Harness) -> ScoringCore:
    core = ScoringCore(ServeConfig(model=MODEL, max_sequences_per_request=PART), RUNTIME)
    core.batcher = h.batcher
    return core


def items(n: int) -> list[SeqInput]:
    return [SeqInput(tokens=[101, 2000 + k, 102]) for k in range(n)]


def busy_harness() -> tuple[Harness, object]:
    """A batcher whose one worker is inside the model with a blocker job until `h.gate.open()`."""
    h = Harness(max_batch_size=8)
    h.gated = True
    blocker = submit(h.batcher, [[1]])
    assert h.gate.wait_entered(1)
    return h, blocker


def after_the_blocker(h: Harness, blocker) -> list[list[int]]:
    """Lets the blocker finish, runs one more job through, and returns every batch the model saw."""
    del h.batcher.submit  # the test's wrapper: the batcher's own again
    h.gated = False
    h.gate.open()
    blocker.get()
    submit(h.batcher, [[9]]).get()
    h.batcher.stop()
    return h.batches


def test_a_caller_gone_while_its_parts_are_queued_drops_every_part():
    h, blocker = busy_harness()
    core = core_on(h)

    async def go():
        request = None
        real_submit = h.batcher.submit

        def submit_then_disconnect(job):
            real_submit(job)
            if job.seqs[0][1] == 2000 + PART:  # the second part: the client goes in the same loop step
                request.cancel()
        h.batcher.submit = submit_then_disconnect
        request = asyncio.ensure_future(core._score_in_parts(items(2 * PART), "none"))
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0)  # the futures' callbacks

    asyncio.run(go())
    assert h.read("rmscore_sequences_dropped_total", "cancelled") == 2 * PART
    assert after_the_blocker(h, blocker) == [[1], [9]], "a part of a request whose caller went was scored"


def test_a_part_refused_by_the_drain_fails_the_request_and_drops_the_parts_before_it():
    h, blocker = busy_harness()
    core = core_on(h)

    async def go():
        real_submit = h.batcher.submit

        def submit_then_drain(job):
            real_submit(job)
            h.batcher.drain(time.monotonic())  # SIGTERM between two parts: refuse from now on, no wait
        h.batcher.submit = submit_then_drain
        with pytest.raises(ScoreError) as refused:
            await core._score_in_parts(items(2 * PART), "none")
        await asyncio.sleep(0)
        return refused.value

    refused = asyncio.run(go())
    assert refused.code == Code.UNAVAILABLE
    assert h.read("rmscore_sequences_dropped_total", "cancelled") == PART
    h.gated = False
    h.gate.open()
    blocker.get()
    h.batcher.stop()
    assert h.batches == [[1]], "the first part of a refused request was scored"
