"""frontends/memory.py: the trim thread collects garbage after a large request, and only then. A refused
1M-id request stayed resident in a reference cycle (grpc.aio's abort keeps its exception, whose
traceback holds the handler's frame and so the request) until Python's cycle collector came round,
minutes later on an idle server (docs/bench/attacks_2026-12-05.md). Automatic collection is off in
the test, so only the trim thread can free the cycle."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from rmscore.frontends import memory


class Held:
    pass


def cycle() -> weakref.ref:
    a, b = Held(), Held()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_large_request_makes_the_next_trim_collect_cycles():
    if memory._malloc_trim() is None:
        pytest.skip("no malloc_trim in this C library: nothing trims")
    gc.collect()
    gc.disable()
    stop = None
    try:
        memory._large_seen.clear()
        ref = cycle()
        stop = memory.start_trimming(interval_s=0.02)
        memory.note_request_bytes(memory.LARGE_REQUEST_BYTES - 1)  # small: trims only
        time.sleep(0.2)
        assert ref() is not None
        memory.note_request_bytes(memory.LARGE_REQUEST_BYTES)
        deadline = time.monotonic() + 5
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ref() is None
        assert not memory._large_seen.is_set()  # one collection per large request seen, not one per trim
    finally:
        if stop is not None:
            stop.set()
        gc.enable()
