"""Where the tools run: the checkout (`ROOT`) and the machine (`machine_info`), which every result
file records. Standard library only, so the Locust file and the scripts can import it cheaply.

The tools are installed editable from a source checkout (scripts/setup.sh) and use what it holds
beside the sources: the C++ build (build/), the model repository (models/), Prometheus' config
(docker/prometheus/) and the Locust file (loadtest/rlhf_client.py).
"""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tools/rmscore_tools/host.py -> the checkout


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "commit": commit, "hostname": platform.node()}
