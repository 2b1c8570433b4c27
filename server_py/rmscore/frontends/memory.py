"""Give freed heap back to the system now and then (glibc's malloc_trim), for both Python servers.

A request body is held in large buffers while it arrives (gRPC core's slices, uvicorn's and
Starlette's bytes). Freed, they go back to glibc's heap, which keeps them: 40 stalled 15 MiB bodies
on py-grpc left +600 MiB resident after their clients had gone (stalled bodies: docs/hardening.md, "Transport
attacks (Python)"). malloc_trim(0) returns the free pages of every arena; called from a thread every few
seconds, it costs milliseconds and needs no hook in either transport.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

#: Seconds between two trims: resident memory is back near its baseline this long after a burst ends.
TRIM_INTERVAL_S = 3.0


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        return None


def start_trimming(interval_s: float = TRIM_INTERVAL_S) -> threading.Event | None:
    """A daemon thread calling malloc_trim(0) every `interval_s`; set the returned event to stop it.
    None where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is None:
        return None
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            trim(0)

    threading.Thread(target=loop, name="malloc-trim", daemon=True).start()
    return stop
