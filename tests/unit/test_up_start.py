"""`rmscore up`'s start-up (up/start.py): a kind that cannot start is reported by name, and the
measured server keeps the CPU while everything else `up` started yields it."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from rmscore_tools import launch
from rmscore_tools.up import stack, start


def test_a_missing_binary_is_reported_by_name_without_stopping_the_start(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-server"
    monkeypatch.setattr(launch, "CPP_BINARY", missing)
    said: list[str] = []
    starting = start.Starting(tmp_path, ["cpp-grpc"], {"model": "models/default"}, 10, stack.free_port, said.append)
    end = time.monotonic() + 10
    while not starting.done() and time.monotonic() < end:
        starting.wait(0.1)
        starting.poll()
    assert starting.done() and not starting.ready and not starting.warming
    assert f"{missing} is missing" in starting.failed["cpp-grpc"]
    assert any(line.startswith("cpp-grpc FAILED") for line in said), said


@pytest.mark.skipif(not start.can_reprioritise(), reason="cannot lower a niceness again here (not root)")
def test_favour_lowers_everything_else_started_and_restores_it():
    # A parent with two children stands for `up` with two servers; one of them is "measured".
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        end = time.monotonic() + 5
        while len(kids := start.observe.descendants(parent.pid)) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        measured, other = kids[:2]
        start.favour(measured, root=parent.pid)
        assert (os.getpriority(os.PRIO_PROCESS, measured), os.getpriority(os.PRIO_PROCESS, other)) == (0, 19)
        start.favour(None, root=parent.pid)
        assert (os.getpriority(os.PRIO_PROCESS, measured), os.getpriority(os.PRIO_PROCESS, other)) == (0, 0)
    finally:
        for pid in start.observe.descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


@pytest.mark.skipif(not start.can_reprioritise(), reason="cannot lower a niceness again here (not root)")
def test_overlap_only_with_cpu_to_spare():
    # A warm-up at nice 19 only gets CPU the measured server leaves idle: none on a busy machine.
    assert start.overlap_allowed(2, 0.5)[0]
    busy, why = start.overlap_allowed(2, 2.0)
    assert not busy and "load average 2.0 on 2 cores" in why
    assert start.overlap_allowed(16, 9.0)[0]
