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
        while memory.trim_once(lambda _: 0):  # nothing owed from an earlier test
            pass
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
    finally:
        if stop is not None:
            stop.set()
        gc.enable()


def test_a_request_still_held_at_the_first_collection_is_freed_by_the_second():
    """Noted on arrival, a large request may still be decoding when the first collection runs; the
    cycle it leaves after that is freed by the next trim, and then collections stop."""
    gc.collect()
    gc.disable()
    calls = []
    try:
        while memory.trim_once(calls.append):
            pass
        memory.note_request_bytes(memory.LARGE_REQUEST_BYTES)
        assert memory.trim_once(calls.append)  # the first trim collects: nothing to free yet
        ref = cycle()  # the request's cycle, made once its refusal is raised
        assert memory.trim_once(calls.append)
        assert ref() is None
        assert not memory.trim_once(calls.append)  # then trims only, until the next large request
        assert calls[-3:] == [0, 0, 0]  # and every one trims
    finally:
        gc.enable()
