"""The C++ serving-overhead benchmark (`rmscore bench --overhead`, build/cpp/rmscore-ort-driver): behaviour
only, never speed. The driver's parity vs the eager golden scores, its interactive protocol, the
batch cutting, and a tiny end-to-end run that writes its JSON and markdown."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from rmscore_tools.bench.overhead import full_batches

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = ROOT / "build/cpp/rmscore-ort-driver"
SERVER = ROOT / "build/cpp/rmscore-server-cpp"
MODEL = ROOT / "models/default"

needs_driver = pytest.mark.skipif(not DRIVER.exists(), reason="run scripts/build_cpp.sh (build/cpp/rmscore-ort-driver)")


def test_full_batches_are_full_by_a_limit_and_cover_what_is_kept():
    lengths = [40, 300, 512, 100, 100, 64, 200, 33, 500, 128] * 7
    seqs = [[1] * n for n in lengths]
    batches, dropped = full_batches(seqs, 32, 8192)
    kept = [i for b in batches for i in b]
    assert len(kept) == len(set(kept)) and len(kept) + dropped == len(seqs)
    for b in batches:
        longest = len(seqs[b[0]])
        assert all(len(seqs[i]) <= longest for i in b)        # longest first
        assert len(b) <= 32 and len(b) * longest <= 8192       # within the limits
        # full: no further sequence, of any length, could join it
        assert len(b) == 32 or (len(b) + 1) * longest > 8192


@needs_driver
def test_driver_parity_within_1e5_of_eager_golden():
    p = subprocess.run([str(DRIVER), "--parity", "--model", str(MODEL)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["reference"] == "golden.score"
    assert r["golden_sequences"] == len(json.loads((MODEL / "manifest.json").read_text())["golden"])
    assert 0 <= r["max_abs_diff"] <= 1e-5
    assert r["session"]["intra_op_threads"] == 2 and r["session"]["inter_op_threads"] == 1


@needs_driver
def test_driver_bad_flag_and_bad_batches_exit_with_a_reason(tmp_path):
    p = subprocess.run([str(DRIVER), "--parity", "--max-batch-size", "0"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--max-batch-size: must be >= 1, got 0" in p.stderr
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps([[[101, 40000, 102]]]))
    p = subprocess.run([str(DRIVER), "--batches", str(bad), "--model", str(MODEL)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert p.returncode == 1 and "token id 40000 out of range" in p.stderr


@needs_driver
def test_driver_batch_mode_and_interactive_mode_agree(tmp_path):
    batches = [[[101] + [2000] * 20 + [102], [101, 3000, 102]], [[101] + [4000] * 40 + [102]]]
    f = tmp_path / "batches.json"
    f.write_text(json.dumps({"batches": batches, "probe": [[101, 5000, 102]]}))
    out = tmp_path / "out.json"
    p = subprocess.run([str(DRIVER), "--batches", str(f), "--repetitions", "2", "--warmup", "1", "--out", str(out),
                        "--model", str(MODEL)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["sequences_per_pass"] == 3 and len(r["pass_wall_s"]) == 2 and r["sequences_per_s"] > 0
    assert [b["sequences"] for b in r["batches"]] == [2, 1]
    assert [b["longest"] for b in r["batches"]] == [22, 42]
    assert all(len(b["wall_s"]) == 2 for b in r["batches"])
    p = subprocess.run([str(DRIVER), "--batches", str(f), "--interactive", "--model", str(MODEL)],
                       input="pass\nprobe 3\nnonsense\nquit\n", capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    ready, passed, probe, err = (json.loads(x) for x in p.stdout.strip().splitlines())
    assert ready == {"ready": True, "batches": 2, "sequences": 3}
    assert len(passed["batch_wall_s"]) == 2 and passed["scores"] == pytest.approx(r["scores_last_pass"], abs=1e-6)
    assert len(probe["probe_wall_s"]) == 3
    assert "unknown command" in err["error"]


@needs_driver
@pytest.mark.skipif(not SERVER.exists(), reason="run scripts/build_cpp.sh (build/cpp/rmscore-server-cpp)")
def test_tiny_bench_run_writes_json_and_markdown(tmp_path):
    p = subprocess.run([sys.executable, "-m", "rmscore.cli", "bench", "--overhead", "--preset", "tiny", "--kinds",
                        "cpp-grpc", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    rec = json.loads((tmp_path / "overhead.json").read_text())
    assert len(rec["repetitions"]) == 2
    assert rec["parity"]["max_abs_diff"] <= 1e-5
    for rep in rec["repetitions"]:
        assert rep["inproc"]["seq_s"] > 0 and rep["inproc"]["small_ms"] > 0
        c = rep["cpp-grpc"]
        assert c["saturation_seq_s"] > 0 and c["startup_s"] > 0 and c["idle_rss_mib"] > 0
        assert len(c["latency_ms"]) > 0 and c["low_load_errors"] == 0 and c["saturation_errors"] == 0
        assert c["batches_run"] == c["requests"]          # the server formed the same batches
        assert c["max_abs_diff_vs_inproc"] <= 1e-5       # and scored them like the driver
    s = rec["summary"]["cpp-grpc"]
    assert {"overhead", "latency_excess_ms", "idle_rss_mib", "startup_s"} <= set(s)
    md = (tmp_path / "overhead.md").read_text()
    assert "serving overhead" in md and "Parity" in md and "cpp-grpc" in md
    assert md in p.stdout  # the table is printed too
    again = subprocess.run([sys.executable, "-m", "rmscore.cli", "bench", "--report-only",
                            str(tmp_path / "overhead.json")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0 and (tmp_path / "overhead.md").read_text() == md, again.stderr


def test_overhead_refuses_a_kind_it_does_not_compare(tmp_path):
    p = subprocess.run([sys.executable, "-m", "rmscore.cli", "bench", "--overhead", "--preset", "tiny", "--kinds",
                        "py-grpc-eager", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert p.returncode != 0 and "--kinds ['py-grpc-eager'] not in cpp-grpc, py-grpc-onnxruntime" in p.stderr
