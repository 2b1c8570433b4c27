"""The long soak (python -m rmscore_tools.reliability.soak_long): a short real run with an environment variant, and the redraw of a saved run.

What is checked is what the run measured (its samples, and the figures and table made from
them) and what it did (the variant's environment reached its server and no other), never a
figure of a committed run."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

import servers

SOAK_LONG = ["-m", "rmscore_tools.reliability.soak_long"]


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The script's markdown table: label -> its cells (start, end, max, growth, slope, requests, errors)."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 8 and cells[0] not in ("server", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def assert_row_shows(row: list[str], soak: dict) -> None:
    start, end, peak, growth, slope, requests, errors = row
    assert float(start) == pytest.approx(soak["rss_start_mb"], abs=0.5)
    assert float(end) == pytest.approx(soak["rss_end_mb"], abs=0.5)
    assert float(peak) == pytest.approx(soak["rss_max_mb"], abs=0.5)
    assert float(growth.removesuffix(" %")) == pytest.approx(soak["rss_growth_pct"], abs=0.05)
    assert float(slope) == pytest.approx(soak["rss_slope_mb_per_min"], abs=0.05)
    assert (int(requests), int(errors)) == (soak["requests"], soak["errors"])


def children_environ(pid: int) -> dict[int, dict[str, str]]:
    """The environment of each direct child of `pid` (the servers soak_long started), from /proc."""
    out = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != pid:
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        out[int(d.name)] = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
    return out


def test_short_soak_with_a_variant_samples_every_server(tmp_path):
    out = tmp_path / "soak"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    proc = subprocess.Popen([sys.executable, *SOAK_LONG, "--kinds", "py-grpc-onnxruntime", "--seconds", "6",
                             "--warmup-seconds", "2", "--sample-seconds", "2", "--concurrency", "2",
                             "--variant", "arena2:MALLOC_ARENA_MAX=2", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=servers.ROOT, env=env)
    seen: dict[int, dict[str, str]] = {}
    end = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < end:  # the servers live only while it runs
        for pid, child_env in children_environ(proc.pid).items():
            seen.setdefault(pid, child_env)
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    stdout = proc.communicate()[0]
    assert proc.returncode == 0, stdout

    # The variant's environment reached the one server started for it, and not the default one.
    arenas = [e.get("MALLOC_ARENA_MAX") for e in seen.values()]
    assert arenas.count("2") == 1 and len(arenas) >= 2, arenas

    record = json.loads(out.with_suffix(".json").read_text())
    assert sorted(record["soaks"]) == ["py-grpc-onnxruntime@arena2", "py-grpc-onnxruntime@default"]
    assert record["variants"] == {"default": {}, "arena2": {"MALLOC_ARENA_MAX": "2"}}
    rows = table_rows(stdout)
    assert sorted(rows) == sorted(record["soaks"]), stdout
    for label, soak in record["soaks"].items():
        assert soak["requests"] > 0 and soak["errors"] == 0, soak
        # Resident memory sampled every ~2 s over the 6 s soak, from the end of the warm-up on. (The
        # last sample, taken once the load stopped, is stamped with the load window's nominal end,
        # which can precede the last tick's stamp by a few ms: faults.soak; only the ticks are ordered.)
        ts = [t for t, _ in soak["samples"]]
        mb = [m for _, m in soak["samples"]]
        ticks = ts[:-1]
        assert len(ts) >= 3 and ts[0] >= 0 and ticks == sorted(set(ticks)), soak["samples"]
        assert all(b - a >= 2 - 1e-3 for a, b in zip(ticks, ticks[1:])), soak["samples"]
        assert min(ts[-1], ticks[-1]) >= 6 - 2, soak["samples"]
        assert all(m > 0 for m in mb), soak["samples"]
        # The figures are those of the samples (which are rounded to 0.01 MiB).
        assert soak["rss_start_mb"] == pytest.approx(mb[0], abs=0.01)
        assert soak["rss_end_mb"] == pytest.approx(mb[-1], abs=0.01)
        assert soak["rss_max_mb"] == pytest.approx(max(mb), abs=0.01)
        assert soak["rss_growth_pct"] == pytest.approx(100 * (soak["rss_end_mb"] / soak["rss_start_mb"] - 1))
        assert_row_shows(rows[label], soak)
    assert out.with_suffix(".png").stat().st_size > 10_000


def saved_soak(start: float, end: float, peak: float, requests: int, errors: int) -> dict:
    samples = [[0.0, start], [60.0, peak], [120.0, end]]
    return {"kind": "k", "seconds": 120.0, "warmup_s": 10, "concurrency": 1, "requests": requests, "errors": errors,
            "error_kinds": {"UNAVAILABLE": errors} if errors else {}, "seq_s": 1.0,
            "latency_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0}, "samples": samples,
            "rss_start_mb": start, "rss_end_mb": end, "rss_max_mb": peak,
            "rss_growth_pct": 100 * (end - start) / start, "rss_slope_mb_per_min": (end - start) / 2}


def plot_only(src: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *SOAK_LONG, "--plot-only", str(src)], capture_output=True, text=True,
                          timeout=120)


def test_plot_only_redraws_a_saved_run_from_its_own_figures(tmp_path):
    soaks = {"alpha@default": saved_soak(200.0, 260.0, 300.0, 1234, 0),
             "beta@arena2": saved_soak(512.0, 480.0, 530.0, 77, 0)}
    src = tmp_path / "saved.json"
    src.write_text(json.dumps({"settings": {}, "variants": {"default": {}, "arena2": {}}, "soaks": soaks}))
    r = plot_only(src)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "saved.png").stat().st_size > 10_000
    rows = table_rows(r.stdout)
    assert rows == {"alpha@default": ["200", "260", "300", "+30.0 %", "30.0", "1234", "0"],
                    "beta@arena2": ["512", "480", "530", "-6.2 %", "-16.0", "77", "0"]}, r.stdout


def test_plot_only_of_a_run_with_errors_exits_1(tmp_path):
    src = tmp_path / "saved.json"
    src.write_text(json.dumps({"settings": {}, "variants": {}, "soaks": {
        "a@default": saved_soak(100.0, 100.0, 100.0, 10, 0), "b@default": saved_soak(100.0, 100.0, 100.0, 10, 3)}}))
    r = plot_only(src)
    assert r.returncode == 1, r.stderr
    assert table_rows(r.stdout)["b@default"][-1] == "3"


def test_plot_only_redraws_the_committed_run(tmp_path):
    """The committed docs/hardening/soak_long.json still redraws: each soak's row shows its own figures."""
    src = tmp_path / "soak_long.json"
    shutil.copy(servers.ROOT / "docs/hardening/soak_long.json", src)
    record = json.loads(src.read_text())
    r = plot_only(src)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "soak_long.png").stat().st_size > 10_000
    rows = table_rows(r.stdout)
    assert sorted(rows) == sorted(record["soaks"]), r.stdout
    for label, soak in record["soaks"].items():
        assert_row_shows(rows[label], soak)


def test_a_malformed_variant_is_refused_with_the_value():
    r = subprocess.run([sys.executable, *SOAK_LONG, "--variant", "nocolon"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "'nocolon'" in r.stderr, r.stderr
