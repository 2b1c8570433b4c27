"""Give freed heap back to the system now and then (glibc's malloc_trim), for both Python servers.

A request body is held in large buffers while it arrives (gRPC core's slices, uvicorn's and
Starlette's bytes). Freed, they go back to glibc's heap, which keeps them: 40 stalled 15 MiB bodies
on py-grpc left +600 MiB resident after their clients had gone (stalled bodies: docs/hardening.md, "Transport
attacks (Python)"). malloc_trim(0) returns the free pages of every arena; called from a thread every few
seconds, it costs milliseconds and needs no hook in either transport.

A large request can outlive its answer, though, in a reference cycle: grpc.aio's `context.abort`
keeps the exception it raises on the call's state while that exception's traceback holds the
handler's frame, and so the request (a refused 1M-id message stayed resident, +60% on py-grpc 10 s
after the attack, freed only a minute or two later when Python's cycle collector got to it; the HTTP
kind kept +68% after refused 1M-id JSON bodies). So after a request of `LARGE_REQUEST_BYTES` or more
the next two trims first run a full garbage collection: a server that never sees one never pays for
it, and a stream of them pays one collection per interval. Two, because the request is noted when it
arrives: one still being decoded or refused when the first collection runs (a 7 MiB JSON body takes
a few hundred milliseconds on a busy 2-core machine) is collected by the second, `TRIM_INTERVAL_S` later.

Trimming alone left up to 17% over baseline after floods of multi-MiB requests (refused 1M-id
sequences, 15 MiB texts). Part of that is glibc's: it raises its mmap threshold each time it frees an
mmapped block, up to 32 MiB, so after the first such request the next ones' buffers come from the
heap, where the small allocations made between them pin its pages. (The rest, on py-http, was
pymalloc's arenas of decoded token ids: json_body.py no longer decodes an over-long array.) So on the ONNX Runtime backend the threshold is pinned
at `MMAP_THRESHOLD_BYTES`: a buffer that large that the heap has no free room for is mapped on its
own, and freeing it unmaps it.
Not on the torch backends: their activations are plain mallocs (ONNX Runtime keeps its own arena), and
an mmap and page faults per op cost py-grpc-eager 0.87 +- 0.19 of its throughput at 64 in flight
(docs/bench/mmap-threshold_2026-12-07/). An operator's `MALLOC_MMAP_THRESHOLD_` is left as glibc applied it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading

#: Seconds between two trims: resident memory is back near its baseline this long after a burst ends.
TRIM_INTERVAL_S = 3.0
#: A request this large (bytes on the wire) makes the next trims collect garbage first.
LARGE_REQUEST_BYTES = 1 << 20
#: On the ONNX Runtime backend, an allocation this large or larger that the heap has no free room for
#: is mmapped, so it is unmapped when freed (the module's docstring says why); glibc's own default
#: moves between 128 KiB and 32 MiB.
MMAP_THRESHOLD_BYTES = LARGE_REQUEST_BYTES
#: mallopt's parameter number for the mmap threshold (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3
#: The environment variable by which glibc takes an operator's threshold at start.
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
#: How many trims collect after a large request arrives (the module's docstring says why two).
COLLECTIONS_AFTER_LARGE = 2

_owed_lock = threading.Lock()
_collections_owed = 0  # guarded by _owed_lock


def note_request_bytes(n: int) -> None:
    """A request of `n` bytes arrived (the transports call it): a large one is collected after."""
    global _collections_owed
    if n >= LARGE_REQUEST_BYTES:
        with _owed_lock:
            _collections_owed = COLLECTIONS_AFTER_LARGE


def trim_once(trim) -> bool:
    """One trim: a full garbage collection first if one is owed, then `trim(0)`. True if it collected."""
    global _collections_owed
    with _owed_lock:
        collect = _collections_owed > 0
        _collections_owed = max(0, _collections_owed - 1)
    if collect:
        gc.collect()
    trim(0)
    return collect


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune this way
        return None


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Allocations of `nbytes` or more are mmapped from now on, and glibc stops moving the threshold.
    False, changing nothing, where the operator set `MALLOC_MMAP_THRESHOLD_` or the C library is not glibc."""
    mallopt = _libc_function("mallopt")
    if mallopt is None or MMAP_THRESHOLD_ENV in os.environ:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes))


def start_trimming(interval_s: float = TRIM_INTERVAL_S, pin_threshold: bool = False) -> threading.Event | None:
    """A daemon thread calling malloc_trim(0) every `interval_s`; set the returned event to stop it.
    With `pin_threshold` (the ONNX Runtime backend), first `pin_mmap_threshold()`. None where the C
    library has no malloc_trim."""
    if pin_threshold:
        pin_mmap_threshold()
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            trim_once(trim)

    threading.Thread(target=loop, name="malloc-trim", daemon=True).start()
    return stop
