"""SIGTERM's drain, one sequence for both Python front ends (docs/hardening.md, drain):

1. the front end says NOT_SERVING (gRPC health; HTTP /readyz reads the core's state), then
   new work is refused: `ScoringCore.begin_drain`;
2. accepted work runs until `ScoringCore.drain_deadline`: the grace less a reserve;
3. what is still queued fails UNAVAILABLE "not ready: draining" while the transport can still
   carry the answers (a batch in the model gets half of what is left of the reserve);
4. the transport gets the rest of the reserve to close its calls, so the process exits within
   --drain-grace-seconds, as the C++ server does.

The front end owns its signal handling, step 1's announcement and step 4's close; `Drain` owns
the clock and steps 2 and 3.
"""

from __future__ import annotations

import time

from rmscore.core.scoring import ScoringCore


class Drain:
    def __init__(self, core: ScoringCore):
        self.core = core
        self.t_signal: float | None = None
        self.drained = False

    def signal(self) -> bool:
        """Note the first signal's time; False for any later signal (the drain is under way)."""
        if self.t_signal is not None:
            return False
        self.t_signal = time.monotonic()
        return True

    def finish(self) -> float:
        """Steps 2 and 3; blocks, so run it off the event loop. Returns the seconds the transport
        may take to close (step 4)."""
        until = self.core.drain_deadline(self.t_signal)
        self.drained = self.core.wait_drained(until)
        reserve_end = until + self.core.shutdown_reserve_s()
        self.core.stop(max(0.0, (reserve_end - time.monotonic()) / 2))
        return max(0.1, reserve_end - time.monotonic() - 0.2)

    def report(self) -> None:
        print(f"rmscore: stopped ({'drained' if self.drained else 'grace period ran out'}) "
              f"{time.monotonic() - self.t_signal:.2f} s after the signal", flush=True)
