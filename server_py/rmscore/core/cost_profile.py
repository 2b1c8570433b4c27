"""Measuring, saving and loading the cost table (cost.py) a server plans with.

At warm-up a server times a small grid of batch shapes on its own runtime (`measure`, bounded by
`--cost-profile-seconds`); with `--cost-profile FILE` it saves the table there, and a restart loads
it instead of measuring again. A profile holds the identity of what it measured (model version,
backend, device, precision, threads): one measured for anything else is refused with a message
naming what differs, and a file that is not a profile is refused as such. Nothing is served from
a refused profile: the server does not start.

Without `--cost-profile` the table is kept in a cache directory (`--cost-profile-dir`, by default
$RMSCORE_CACHE_DIR/cost-profiles, else $XDG_CACHE_HOME/rmscore/cost-profiles, else
~/.cache/rmscore/cost-profiles), one file per model, backend, device, precision, thread count and
batch size limit, so `cost_aware`, the default, measures once per machine and not at every start.
The cache is lenient where `--cost-profile` is strict: a cached file measured for anything else (the
model's version, another CPU) or corrupt is not used; the server says why, measures again and
replaces it. The C++ server reads and writes the same format and the same cache (server_cpp/src/cost_profile.cc).

A profile says how its batches were timed (`timing`): by the CPU time of the thread that ran them
where a run works on its caller's thread alone (a 1-thread session on a CPU: --model-workers
elastic's workers), else by the wall clock. A cached file refined before profiles said so was
refined by the wall clock, so other processes' load is in its cells (a machine's cache, refined
through 10,305 batches beside load tests, said a 128-token sequence costs 95 ms alone and 27 ms in a
batch of 32): it is not used, and measured again.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import threading
import time
from typing import Callable

from rmscore.core.cost import CostError, CostTable, grid

FORMAT = "rmscore-cost-profile/1"
#: What a profile must match, in the order a mismatch is reported.
#: model_workers 0 (--model-workers auto) matches any count: the server then runs the profile's.
IDENTITY_KEYS = ("model", "model_version", "backend", "device", "precision", "intra_op_threads", "model_workers",
                 "cpu")
#: How a profile's batches were timed (its `timing`): their thread's CPU time, or the wall clock.
THREAD_CPU, WALL = "thread-cpu", "wall"
#: Where the CPU's name is read (the C++ server reads the same line).
CPUINFO = pathlib.Path("/proc/cpuinfo")


class ProfileError(ValueError):
    pass


def cpu_model(cpuinfo: pathlib.Path = CPUINFO) -> str:
    """The CPU's name as the kernel gives it (the first `model name` line), or "unknown": what a table
    was measured on, since the same model costs differently on an AMD EPYC and an Intel Xeon."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return "unknown"


def identity(repo, cfg) -> dict:
    """What a profile for a server of this model repository and ServeConfig must match."""
    return {"model": repo.name, "model_version": repo.version, "backend": cfg.backend, "device": cfg.device,
            "precision": cfg.precision, "intra_op_threads": cfg.intra_op_threads, "model_workers": cfg.model_workers,
            "cpu": cpu_model()}


def default_dir(env=None) -> pathlib.Path:
    """The cache directory of cost profiles when --cost-profile-dir is not given (module docstring)."""
    env = os.environ if env is None else env
    if env.get("RMSCORE_CACHE_DIR"):
        base = pathlib.Path(env["RMSCORE_CACHE_DIR"])
    elif env.get("XDG_CACHE_HOME"):
        base = pathlib.Path(env["XDG_CACHE_HOME"]) / "rmscore"
    else:
        base = pathlib.Path(env.get("HOME") or "/tmp") / ".cache" / "rmscore"
    return base / "cost-profiles"


def cache_path(directory: pathlib.Path, identity: dict, max_batch_size: int) -> pathlib.Path:
    """The cached profile's file for a server of `identity`: the parts that pick a table in its name,
    the rest (model version, CPU, workers) checked inside it, so a mismatch can be reported. The same
    name in C++ (cost_profile::CachePath)."""
    name = "-".join(str(v) for v in (identity["model"], identity["backend"], identity["device"],
                                     identity["precision"], f"{identity['intra_op_threads']}t", f"b{max_batch_size}"))
    return directory / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".json")


def timing(device: str, threads_per_run: int) -> str:
    """How a table of runs on sessions of `threads_per_run` intra-op threads is timed: by the running
    thread's CPU time where a run works on its caller's thread alone (one thread, on a CPU), which other
    processes' load does not inflate; else by the wall clock (a GPU's work is not the thread's)."""
    return THREAD_CPU if device == "cpu" and threads_per_run == 1 else WALL


def clock(timing: str) -> Callable[[], float]:
    """The clock a table of this `timing` is measured by, in seconds."""
    return time.thread_time if timing == THREAD_CPU else time.perf_counter


def load_cached(path: pathlib.Path, identity: dict, progress: Callable[[str], None]) -> tuple[CostTable, int] | None:
    """The cached table and its model workers, or None (said through `progress`, with the reason) when
    there is none or it cannot be used: then the server measures again and replaces it."""
    if not path.exists():
        progress(f"cost profile: none cached at {path}: measuring")
        return None
    try:
        return load(path, identity, where=f"cached cost profile {path}")
    except ProfileError as e:
        progress(f"cost profile: not used: {e}; measuring again (the file will be replaced)")
        return None


def load(path: pathlib.Path, identity: dict, where: str | None = None) -> tuple[CostTable, int]:
    """The table in `path` and the model workers it was measured with, or ProfileError saying why it
    cannot be used by a server of `identity`. A cached file (`where` given) refined before profiles said
    their timing is refused too (the module's docstring); the operator's file is loaded as written."""
    strict = where is None  # --cost-profile: the operator's file, refused with what to do about it
    where = where or f"--cost-profile {path}"
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ProfileError(f"{where}: cannot read a cost profile: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ProfileError(f"{where}: not a cost profile (format {got!r}, expected {FORMAT!r})")
    theirs = doc.get("identity") if isinstance(doc.get("identity"), dict) else {}
    for key in IDENTITY_KEYS:
        if key == "model_workers" and identity[key] == 0 and isinstance(theirs.get(key), int) and theirs[key] >= 1:
            continue
        if theirs.get(key) != identity[key]:
            raise ProfileError(f"{where}: measured for {key}={theirs.get(key)!r}, but this server runs "
                               f"{key}={identity[key]!r}"
                               + ("; remove the file (or name another) to measure again" if strict else ""))
    refined = doc.get("refined_batches")
    if not strict and isinstance(refined, (int, float)) and refined != 0 and doc.get("timing") not in (THREAD_CPU, WALL):
        raise ProfileError(f"{where}: refined by the wall clock before profiles said how they were timed, "
                           "so other processes' load is in its cells")
    try:
        return CostTable.from_json(doc.get("table")), theirs["model_workers"]
    except CostError as e:
        raise ProfileError(f"{where}: corrupt table: {e}") from None


def save(path: pathlib.Path, table: CostTable, identity: dict, seconds: float, timing: str = WALL) -> None:
    """Writes the profile atomically (a crash leaves the old file or none, never half of one);
    `timing`: how its batches were timed (THREAD_CPU or WALL)."""
    doc = {"format": FORMAT, "identity": identity, "timing": timing, "measured_seconds": round(seconds, 3),
           "measured_at": _now(), "table": table.to_json()}
    _write(path, doc)


def save_refined(path: pathlib.Path, table: CostTable, identity: dict, batches: int, timing: str = WALL) -> None:
    """Writes the table as the batches served refined it (cost.CostModel.observe), so the next start
    plans with what this machine showed under load, not only with its warm-up's few timings: the
    measurement's fields are kept, `refined_batches` counts the batches that refined it since, over
    every start, and `refined_at` says when. A file that is not this identity's profile is replaced.
    One save at a time in this process: two model workers' idle spells (or one and the stop) save at
    once, and each read-modify-write would drop the other's batches, or find its temporary file gone."""
    with _SAVING:
        try:
            old = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            old = None
        doc = {"format": FORMAT, "identity": identity, "timing": timing}
        if isinstance(old, dict) and old.get("format") == FORMAT and old.get("identity") == identity:
            doc.update({k: old[k] for k in ("measured_seconds", "measured_at") if k in old})
            prior = old.get("refined_batches")
            batches += prior if isinstance(prior, int) and prior >= 0 else 0
        doc.update(refined_batches=batches, refined_at=_now(), table=table.to_json())
        _write(path, doc)


_SAVING = threading.Lock()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write(path: pathlib.Path, doc: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def measure(run: Callable[[int, int], float], max_batch_size: int, max_length: int, budget_s: float,
            progress: Callable[[str], None]) -> tuple[CostTable, float]:
    """Times the grid's shapes, cheapest first, until `budget_s` is spent: `run(B, L)` scores one
    batch of that shape and returns its seconds. Each shape runs twice and keeps the faster (the
    first run of a shape pays allocation). Shapes left unmeasured when the budget runs out are
    extrapolated in proportion to tokens from the largest measured shape of their length (or of
    any length), which over-states what large batches cost: the planner then prefers the shapes it
    has seen. Returns the table and the seconds spent."""
    sizes, lengths = grid(max_batch_size, max_length)
    cells = sorted(((b, n) for b in sizes for n in lengths), key=lambda c: (c[0] * c[1], c[0]))
    measured: dict[tuple[int, int], float] = {}
    t0 = time.perf_counter()
    for k, (b, n) in enumerate(cells):
        if time.perf_counter() - t0 > budget_s and measured:
            break
        measured[(b, n)] = min(run(b, n), run(b, n))
        if k % 8 == 7 or k == len(cells) - 1:
            progress(f"cost profile: {k + 1}/{len(cells)} shapes in {time.perf_counter() - t0:.1f} s")
    spent = time.perf_counter() - t0
    if len(measured) < len(cells):
        progress(f"cost profile: budget {budget_s:g} s spent after {len(measured)}/{len(cells)} shapes; "
                 f"the rest extrapolated")
    rows = [[round(1e6 * _at(measured, b, n)) for n in lengths] for b in sizes]
    return CostTable.make(sizes, lengths, [[max(1, v) for v in row] for row in rows]), spent


def _at(measured: dict[tuple[int, int], float], b: int, n: int) -> float:
    if (b, n) in measured:
        return measured[(b, n)]
    same_len = [k for k in measured if k[1] == n]
    base = max(same_len or measured, key=lambda k: k[0] * k[1])
    return measured[base] * (b * n) / (base[0] * base[1])


def describe(table: CostTable) -> str:
    """The table as text: microseconds per sequence, batch sizes down, lengths across."""
    head = "B \\ L  " + "".join(f"{n:>9}" for n in table.lengths)
    lines = [head, "-" * len(head)]
    for i, b in enumerate(table.batch_sizes):
        lines.append(f"{b:>6}  " + "".join(f"{table.cost_us[i][j] / b / 1e3:>9.2f}" for j in range(len(table.lengths))))
    return "\n".join(["model ms per sequence (a batch's time / B)"] + lines)
