"""`rmscore up` end to end on a small budget: real servers, real Prometheus, real Locust.

One run with every phase shrunk to seconds and `--keep-running`: the stack must stay up (Locust
web UI and Prometheus answer), stop on Ctrl-C, leave no process behind, and leave a ranking of
every started kind and a report page that headless Chromium renders with every image loaded.
A second, smaller run has one server killed as it starts: the other is still ranked, the dead one
is a failed row in the table and on the page, nothing is left running and the exit status is 3.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest

from rmscore_tools import launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
RMSCORE = pathlib.Path(sys.executable).with_name("rmscore")
KINDS = [k for k in ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime") if k in launch.built_kinds()]
# A ramp of C = 1, 2 only: a level of 4 in flight costs seconds per kind on 2 busy cores, and the
# ranking's machinery is the same.
SMALL = ["--duration-seconds", "12", "--windows", "3", "--window-seconds", "1", "--ramp-window-seconds", "0.5",
         "--max-concurrency", "2", "--warmup-seconds", "0.5"]
PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (setup.sh)")


def processes_naming(text: str) -> list[str]:
    """Every live process whose command line contains `text` (the run directory is on each one's)."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d.name}: {cmd[:200]}")
    return found


def wait_for_process(text: str, timeout_s: float) -> int:
    """The PID of the first live process whose command line contains `text`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if found := processes_naming(text):
            return int(found[0].split(":")[0])
        time.sleep(0.02)
    raise AssertionError(f"no process naming {text!r} within {timeout_s} s")


def wait_for_line(proc: subprocess.Popen, pattern: str, log: list[str], timeout_s: float) -> re.Match:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        if m := re.search(pattern, line):
            return m
    raise AssertionError(f"no line matching {pattern!r} (exit {proc.poll()}); output:\n{''.join(log)[-5000:]}")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One small `rmscore up --keep-running`, checked while up, then stopped with Ctrl-C (SIGINT)."""
    out = tmp_path_factory.mktemp("up") / "run"
    proc = subprocess.Popen([str(RMSCORE), "up", "--kinds", ",".join(KINDS), "--out", str(out), "--keep-running",
                             *SMALL], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    try:
        ui = wait_for_line(proc, r"Locust web UI: (http://\S+)", log, 400).group(1)
        prom = re.search(r"Prometheus: (http://\S+)", "".join(log)).group(1)
        up_state = {"ui": httpx.get(ui, timeout=10).status_code,
                    "prom": httpx.get(f"{prom}/-/ready", timeout=10).status_code}
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"out": out, "rc": proc.returncode, "log": "".join(log) + rest, "up": up_state}


def test_keep_running_serves_then_ctrl_c_stops_everything(run):
    assert run["up"] == {"ui": 200, "prom": 200}, run["log"][-3000:]
    assert run["rc"] == 130, run["log"][-3000:]
    assert "stopping everything it started" in run["log"]
    assert processes_naming(str(run["out"])) == []


def test_ranking_holds_every_started_kind(run):
    result = json.loads((run["out"] / "result.json").read_text())
    ranked = [r["kind"] for r in result["ranking"]]
    assert sorted(ranked) == sorted(KINDS), run["log"][-3000:]
    tput = [r["throughput"]["mean"] for r in result["ranking"]]
    assert tput == sorted(tput, reverse=True) and tput[-1] > 0
    assert result["ranking"][0]["throughput_ratio"] == 1.0
    for r in result["ranking"]:
        assert r["throughput"]["n"] == 3 and r["errors"] == 0, r
    rows = {r["kind"]: r for r in result["contended"]["rows"]}
    assert sorted(rows) == sorted(KINDS)
    for kind, r in rows.items():
        assert r["rollouts"] >= 1 and r["errors"] == 0, r
        assert r["offered_seq_s"] < result["alone"][kind]["throughput"]["mean"], r
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    for kind in KINDS:  # the terminal's table names every kind
        assert re.search(rf"\| \d \| {kind} \|", run["log"]), kind


def test_page_shows_the_dashboards_panels(run):
    result = json.loads((run["out"] / "result.json").read_text())
    panels = result["panels"]
    with_data = {p["panel"] for p in panels if p["value"] not in ("",) and p["series"] != "query failed"}
    assert "Throughput now (sequences/s)" in with_data, panels[:5]
    failed = [p for p in panels if p["series"] == "query failed"]
    assert not failed, failed[:3]


def test_page_renders_in_headless_chromium_with_every_image(run, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed (scripts/setup.sh installs it)")
    page = (run["out"] / "index.html").read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4, f"{len(images)} images inlined"
    for data in images:
        assert base64.b64decode(data).startswith(PNG)
    # A copy of the page with a script that writes each image's decoded width into the DOM.
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", "<script>window.addEventListener('load',()=>{for(const i of "
                                  "document.images)i.setAttribute('data-natural-width',i.naturalWidth)});"
                                  "</script></body>"))
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    widths = [int(w) for w in re.findall(r'data-natural-width="(\d+)"', dom)]
    assert len(widths) == 4 and all(w > 100 for w in widths), (widths, dom[:500])
    assert "rmscore up: which runtime is fastest here" in dom


@pytest.mark.skipif("cpp-grpc" not in launch.built_kinds(), reason="the C++ server is not built")
def test_a_server_that_dies_is_reported_and_the_others_still_ranked(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([str(RMSCORE), "up", "--kinds", "cpp-grpc,py-grpc-onnxruntime", "--out", str(out),
                             *SMALL[2:], "--duration-seconds", "4", "--windows", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Killed as soon as it exists (its port file is in the run directory), by its PID.
        os.kill(wait_for_process(f"{out}/py-grpc-onnxruntime/ports.json", 60), signal.SIGKILL)
        log, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, log[-3000:]
    assert re.search(r"exit status 3: 1 of 2 server kinds failed \(py-grpc-onnxruntime\)", log), log[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert [r["kind"] for r in result["ranking"]] == ["cpp-grpc"]
    assert list(result["failed"]) == ["py-grpc-onnxruntime"]
    assert "-9" in result["failed"]["py-grpc-onnxruntime"]  # the cause: killed (SIGKILL)
    for text in (log, (out / "summary.md").read_text()):
        assert re.search(r"\| - \| py-grpc-onnxruntime \| failed: ", text), text[-2000:]
    assert "<td>py-grpc-onnxruntime</td><td>failed: " in (out / "index.html").read_text()
    assert processes_naming(str(out)) == []
