"""What belongs to the process that runs a server, not to the scoring core: its port file and its
exit. Both Python front ends' runners call these."""

from __future__ import annotations

import json
import os
import pathlib
import sys

from rmscore.core.scoring import ScoringCore


def write_port_file(path: pathlib.Path | None, port: int, metrics_port: int) -> None:
    """Says the bound ports on stdout and, with --port-file, in that file, written whole (a rename)."""
    print(f"rmscore listening port={port} metrics_port={metrics_port}", flush=True)
    if path is None:
        return
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"port": port, "metrics_port": metrics_port}))
    tmp.rename(path)


def exit_code(core: ScoringCore, code: int) -> int:
    """Return `code`, or leave at once when a load or a batch is still running: a torch batch cannot
    be interrupted and must not hold the exit past the grace, and ONNX Runtime aborts the process
    ("terminate called") when the interpreter tears down under its running thread."""
    if core.still_running():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
