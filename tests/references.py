"""Whether an object was let go, for tests that check nothing keeps a request alive after its answer."""

from __future__ import annotations

import time


def released(ref, within_s: float = 5.0) -> bool:
    """True once the weak reference `ref` is dead; waits up to `within_s` for a thread that still has
    to loop back before it lets go (polling, so the test never sleeps longer than it must)."""
    end = time.monotonic() + within_s
    while ref() is not None and time.monotonic() < end:
        time.sleep(0.01)
    return ref() is None
