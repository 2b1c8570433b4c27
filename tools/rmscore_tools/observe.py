"""What a running server shows from outside: resident memory (/proc) and its Prometheus metrics."""

from __future__ import annotations

import os
import pathlib
import re


def rss_mb(pid: int) -> float:
    """Resident memory of one process (VmRSS), MiB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) one process has used so far, from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def tree_rss_mb(pid: int) -> float:
    """Resident memory of `pid` and all its descendants (a process gone meanwhile counts 0), MiB."""
    total = rss_mb(pid)
    for p in descendants(pid):
        try:
            total += rss_mb(p)
        except (OSError, RuntimeError):
            pass
    return total


def metric(server, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    return metrics(server, name, **labels)[name]


def metrics(server, *names: str, **labels) -> dict[str, float]:
    """`metric` for several names from one scrape, so they describe the same moment."""
    total = dict.fromkeys(names, 0.0)
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in server.metrics_text().splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in total and all(w in (m.group(2) or "") for w in want):
            total[m.group(1)] += float(m.group(3))
    return total
