"""`rmscore up`, start-up: every server kind spawned at once, each measured as soon as it serves.

Where the time went (2 cores, default arguments, before this module): the kinds were started one
after another, and each Python server imports torch before it binds its port, so the last one
was spawned 83 s in; then torch.compile's warm-up (its first graph compile about a minute, then
the self-check) held every measurement back until 175 s. Now:

* `Starting` spawns every kind at once (one thread per launch.start, which returns once the
  server has bound) and reports each as it passes SERVING (the warm-up and the self-check
  against the golden scores are done), or as failed, with the end of its log.
* `favour(pid)`: while one server is measured alone, every other process `rmscore up` started
  (servers still warming up, idle ones, Prometheus) runs at the lowest CPU priority (nice 19),
  so a torch.compile warm-up only gets the CPU time the measured server and its client leave
  unused; between measurements everything is back at the normal priority so the warm-up goes
  at full speed. Where the priority cannot be restored (not root and no RLIMIT_NICE), or the
  machine has no CPU to spare (`overlap_allowed`), `up` does not overlap at all: it waits for
  every server before measuring the first.
"""

from __future__ import annotations

import os
import pathlib
import resource
import time
from concurrent.futures import Future, ThreadPoolExecutor

from rmscore_tools import launch, observe
from rmscore_tools.kinds import KINDS

LOWEST = 19


def can_reprioritise() -> bool:
    """Whether this process may lower a niceness it raised (root, or RLIMIT_NICE allows nice 0)."""
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def overlap_allowed(cores: int, load_avg: float) -> tuple[bool, str]:
    """Whether to measure while others warm up, and why. It only pays with CPU time to spare:
    on a machine already busy (1-minute load average at or above the core count), a warm-up at
    nice 19 gets nothing while a server is measured (here, at load 15-27 on 2 cores,
    torch.compile was SERVING after 572 s instead of 175 s), so then `up` waits for all."""
    if not can_reprioritise():
        return False, "cannot lower a raised niceness again here (not root, RLIMIT_NICE): every server first"
    if load_avg >= cores:
        return False, (f"load average {load_avg:.1f} on {cores} cores, no CPU to spare for warm-ups during a "
                       "measurement: every server first")
    return True, f"load average {load_avg:.1f} on {cores} cores: measuring while torch.compile warms up at nice 19"


def _renice(pids, nice: int) -> None:
    # Niceness is per thread on Linux: every thread of every process. Threads and processes
    # created later inherit it from the thread that makes them.
    for pid in pids:
        try:
            tids = [int(t.name) for t in pathlib.Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:  # gone meanwhile
                pass


def favour(pid: int | None, root: int | None = None) -> None:
    """`pid` and its descendants at normal priority, every other process below `root` (default:
    this one, so everything `up` started) at the lowest; `favour(None)`: all at normal priority."""
    first = {pid, *observe.descendants(pid)} if pid else set()
    rest = set(observe.descendants(root or os.getpid())) - first
    _renice(rest, LOWEST if pid else 0)
    _renice(first, 0)


class Starting:
    """Every kind spawned at once; `poll()` moves servers from bound to SERVING (or failed)."""

    def __init__(self, run_dir: pathlib.Path, kinds: list[str], flags: dict, ready_timeout_s: float, free_port,
                 say, overlap: bool = True, on_bound=None):
        """`flags`: every server's (docs/contract.md names); `free_port(preferred)` picks its ports;
        `overlap`: measuring may begin before every server is SERVING (the caller's choice, see
        `can_reprioritise`); `on_bound(kind, server)`: called once a server has bound its ports."""
        self.run_dir, self.flags, self.free_port, self.say = run_dir, flags, free_port, say
        self.overlap, self.on_bound = overlap, on_bound
        self.t0 = time.monotonic()
        self.deadline = self.t0 + ready_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.pool = ThreadPoolExecutor(max_workers=len(kinds), thread_name_prefix="up-start")
        self.spawning: dict[str, Future] = {k: self.pool.submit(self._spawn, k) for k in kinds}
        self.warming: dict = {}  # bound, not yet SERVING
        self.ready: dict = {}  # SERVING, in the order they became so
        self.ready_s: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.pool.shutdown(wait=False)

    def _spawn(self, kind: str):
        k = KINDS[kind]
        port = self.free_port(k.port)
        flags = dict(self.flags)
        if k.transport == "grpc":
            flags["metrics_port"] = self.free_port(k.metrics_port)
        if port != k.port:
            self.say(f"{kind}: port {k.port} is taken, using {port}")
        if k.language == "cpp" and not launch.CPP_BINARY.exists():
            raise RuntimeError(f"{launch.CPP_BINARY} is missing; scripts/setup.sh builds it")
        return launch.start(kind, port, wait_ready=False, ready_timeout_s=self.ready_timeout_s,
                            log_dir=self.run_dir / kind, **flags)

    def all_bound(self) -> bool:
        return not self.spawning

    def done(self) -> bool:
        return not self.spawning and not self.warming

    def bound(self) -> dict:
        return {**self.ready, **self.warming}

    def poll(self) -> None:
        """Collect the servers spawned since, then health-check the warming ones."""
        for kind, fut in list(self.spawning.items()):
            if not fut.done():
                continue
            del self.spawning[kind]
            try:
                server = fut.result()
            except Exception as e:  # noqa: BLE001 - a missing binary (OSError) as much as a crash at start
                self._fail(kind, f"did not start (log {self.run_dir / kind / 'server.log'}):\n{e}")
                continue
            self.warming[kind] = server
            if self.on_bound:
                self.on_bound(kind, server)
            self.say(f"{kind}: bound 127.0.0.1:{server.port} after {time.monotonic() - self.t0:.0f} s, warming up")
        for kind, server in list(self.warming.items()):
            if server.is_ready():
                self.ready[kind] = self.warming.pop(kind)
                self.ready_s[kind] = time.monotonic() - self.t0
                self.say(f"{kind}: SERVING after {self.ready_s[kind]:.0f} s (warm-up and self-check done)")
            elif server.proc.poll() is not None or time.monotonic() > self.deadline:
                why = f"exited with {server.proc.returncode}" if server.proc.poll() is not None else "not ready in time"
                del self.warming[kind]
                server.stop(5)
                self._fail(kind, f"{why} before SERVING (log {server.log_path}):\n{server.log()[-1500:]}")

    def _fail(self, kind: str, why: str) -> None:
        self.failed[kind] = why
        self.say(f"{kind} FAILED: {why}")

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, less if a spawn finishes meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not any(f.done() for f in self.spawning.values()):
            time.sleep(0.05)
