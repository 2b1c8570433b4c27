"""frontends/memory.py: the trim thread collects garbage after a large request, and only then. A refused
1M-id request stayed resident in a reference cycle (grpc.aio's abort keeps its exception, whose
traceback holds the handler's frame and so the request) until Python's cycle collector came round,
minutes later on an idle server (docs/bench/attacks_2026-12-05.md). Automatic collection is off in
the test, so only the trim thread can free the cycle."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
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
    if memory._libc_function("malloc_trim") is None:
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


# In a child process: pinning changes this process's allocator for good, and the torch tests sharing
# it would pay for it. glibc's mallinfo2 counts the live mmapped blocks (hblks).
_MMAPPED_AFTER_A_BIGGER_FREE = textwrap.dedent("""
    import ctypes, sys
    from rmscore.frontends import memory
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                    "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    pinned = memory.pin_mmap_threshold() if sys.argv[1] == "pin" else False
    libc.free(libc.malloc(8 << 20))  # glibc's default raises its threshold past 8 MiB here
    before = libc.mallinfo2().hblks
    p = libc.malloc(2 << 20)  # a 2 MiB request buffer, over MMAP_THRESHOLD_BYTES
    print(pinned, libc.mallinfo2().hblks - before)
    libc.free(p)
""")


def _mmapped_after_a_bigger_free(arm: str, **env) -> str:
    if memory._libc_function("mallinfo2") is None:
        pytest.skip("not glibc >= 2.33: no mallinfo2 to count mmapped blocks")
    child_env = {k: v for k, v in os.environ.items() if k != memory.MMAP_THRESHOLD_ENV} | env
    out = subprocess.run([sys.executable, "-c", _MMAPPED_AFTER_A_BIGGER_FREE, arm], env=child_env,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_a_pinned_threshold_keeps_large_buffers_mmapped_after_a_bigger_one_was_freed():
    """Unpinned, glibc serves the 2 MiB buffer from the heap once an 8 MiB one was freed (so trimming
    cannot give its pages back while small allocations sit beside it); pinned, it is its own mapping."""
    assert _mmapped_after_a_bigger_free("default") == ["False", "0"]
    assert _mmapped_after_a_bigger_free("pin") == ["True", "1"]


def test_an_operators_threshold_is_left_as_glibc_applied_it():
    # glibc takes 16 MiB from the environment: the 2 MiB buffer comes from the heap, and pinning declines
    assert _mmapped_after_a_bigger_free("pin", MALLOC_MMAP_THRESHOLD_=str(16 << 20)) == ["False", "0"]
