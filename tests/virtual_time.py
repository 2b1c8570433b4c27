"""An asyncio event loop whose clock the test drives: `run(coro)`.

The loop's time starts at 0 and only moves when nothing is ready to run: it then jumps to the
next timer (a sleep, a wait_for, a call_later), so backoffs and deadlines of seconds take no real
time and land on exact, repeatable instants. The client's retry and streaming code reads the
loop's clock (rmscore_client.policy.now), which is why this works on it. A loop with nothing
ready and no timer would wait forever: `run` raises `Stuck` instead of hanging the test.
"""

from __future__ import annotations

import asyncio
import selectors


class Stuck(RuntimeError):
    """Nothing can run and no timer is due: the code under test waits for something that never comes."""


class _Selector(selectors.BaseSelector):
    """The real selector (the loop's self-pipe still works) that never blocks: a wait for `timeout`
    advances the loop's clock by `timeout` instead."""

    def __init__(self):
        self._real = selectors.DefaultSelector()
        self.loop: VirtualTimeLoop | None = None

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_map(self):
        return self._real.get_map()

    def close(self):
        self._real.close()

    def select(self, timeout=None):
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Stuck("nothing is ready and no timer is set")
        self.loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        sel = _Selector()
        self.now = 0.0
        super().__init__(selector=sel)
        sel.loop = self

    def time(self) -> float:
        return self.now


def run(coro):
    """Run `coro` to its end on a fresh VirtualTimeLoop (the clock starts at 0)."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


def now() -> float:
    return asyncio.get_running_loop().time()
