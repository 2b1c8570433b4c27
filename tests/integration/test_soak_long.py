"""scripts/soak_long.py: a short real run with an environment variant, and the redraw of a saved run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import servers

SCRIPT = servers.ROOT / "scripts/soak_long.py"


def test_short_soak_with_a_variant_samples_every_server(tmp_path):
    out = tmp_path / "soak"
    r = subprocess.run([sys.executable, str(SCRIPT), "--kinds", "py-grpc-onnxruntime", "--seconds", "6",
                        "--warmup-seconds", "2", "--sample-seconds", "2", "--concurrency", "2",
                        "--variant", "arena2:MALLOC_ARENA_MAX=2", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=servers.ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads(out.with_suffix(".json").read_text())
    assert sorted(record["soaks"]) == ["py-grpc-onnxruntime@arena2", "py-grpc-onnxruntime@default"]
    assert record["variants"]["arena2"] == {"MALLOC_ARENA_MAX": "2"}
    for soak in record["soaks"].values():
        assert soak["requests"] > 0 and soak["errors"] == 0, soak
        assert len(soak["samples"]) >= 3, soak
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "| py-grpc-onnxruntime@arena2 |" in r.stdout


def test_plot_only_redraws_the_committed_run(tmp_path):
    src = tmp_path / "soak_long.json"
    shutil.copy(servers.ROOT / "docs/hardening/soak_long.json", src)
    r = subprocess.run([sys.executable, str(SCRIPT), "--plot-only", str(src)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "soak_long.png").stat().st_size > 10_000
    assert "| cpp-grpc@default | 427 | 427 |" in r.stdout


def test_a_malformed_variant_is_refused_with_the_value():
    r = subprocess.run([sys.executable, str(SCRIPT), "--variant", "nocolon"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "'nocolon'" in r.stderr, r.stderr
