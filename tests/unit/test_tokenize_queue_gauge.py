"""The gauge of work waiting to be tokenized, rmscore_tokenize_queue_characters (issue 29): the
characters the tokenizing pool has accepted and not yet tokenized, as admission counts them, read at
each scrape. Before, that work was visible only through the refusals it caused."""

from __future__ import annotations

import asyncio
import threading

from rmscore.core.metrics import Metrics
from rmscore.core.tokenizing import TokenizePool

NAME = "rmscore_tokenize_queue_characters"
LABELS = {"server": "py-http", "backend": "onnxruntime", "device": "cpu"}


def test_the_gauge_is_the_characters_accepted_and_not_yet_tokenized():
    metrics = Metrics("py-http", "onnxruntime")
    pool = TokenizePool(max_wait_s=60, threads=1)
    metrics.set_tokenize_queue_source(pool.waiting_chars)
    gauge = lambda: metrics.registry.get_sample_value(NAME, LABELS)  # noqa: E731
    assert gauge() == 0
    started, release = threading.Event(), threading.Event()

    def held():  # the piece the one thread is tokenizing, until released
        started.set()
        release.wait(10)
        return ["a"]

    async def scenario():
        first = asyncio.ensure_future(pool.run([(held, 3000), (lambda: ["b"], 500)], None))
        second = asyncio.ensure_future(pool.run([(lambda: ["c"], 200)], None))
        third = asyncio.ensure_future(pool.run([(lambda: ["d"], 7000)], None))
        await asyncio.to_thread(started.wait, 10)
        assert gauge() == 3000 + 500 + 200 + 7000  # the running piece counts until it is done
        third.cancel()  # a caller gone: its pieces not started leave the queue
        await asyncio.gather(third, return_exceptions=True)
        assert gauge() == 3700
        release.set()
        assert await first == ["a", "b"] and await second == ["c"]
        assert gauge() == 0

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        pool.shutdown()
