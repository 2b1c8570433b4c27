"""Measuring, saving and loading the cost table (cost.py) a server plans with.

At warm-up a server times a small grid of batch shapes on its own runtime (`measure`, bounded by
`--cost-profile-seconds`); with `--cost-profile FILE` it saves the table there, and a restart loads
it instead of measuring again. A profile holds the identity of what it measured (model version,
backend, device, precision, threads): one measured for anything else is refused with a message
naming what differs, and a file that is not a profile is refused as such. Nothing is served from
a refused profile: the server does not start. The C++ server reads and writes the same format
(server_cpp/src/cost.cc).
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Callable

from rmscore.core.cost import CostError, CostTable, grid

FORMAT = "rmscore-cost-profile/1"
#: What a profile must match, in the order a mismatch is reported.
#: model_workers 0 (--model-workers auto) matches any count: the server then runs the profile's.
IDENTITY_KEYS = ("model", "model_version", "backend", "device", "precision", "intra_op_threads", "model_workers")


class ProfileError(ValueError):
    pass


def identity(repo, cfg) -> dict:
    """What a profile for a server of this model repository and ServeConfig must match."""
    return {"model": repo.name, "model_version": repo.version, "backend": cfg.backend, "device": cfg.device,
            "precision": cfg.precision, "intra_op_threads": cfg.intra_op_threads, "model_workers": cfg.model_workers}


def load(path: pathlib.Path, identity: dict) -> tuple[CostTable, int]:
    """The table in `path` and the model workers it was measured with, or ProfileError saying why it
    cannot be used by a server of `identity`."""
    where = f"--cost-profile {path}"
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
                               f"{key}={identity[key]!r}; remove the file (or name another) to measure again")
    try:
        return CostTable.from_json(doc.get("table")), theirs["model_workers"]
    except CostError as e:
        raise ProfileError(f"{where}: corrupt table: {e}") from None


def save(path: pathlib.Path, table: CostTable, identity: dict, seconds: float) -> None:
    """Writes the profile atomically (a crash leaves the old file or none, never half of one)."""
    doc = {"format": FORMAT, "identity": identity, "measured_seconds": round(seconds, 3),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "table": table.to_json()}
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
