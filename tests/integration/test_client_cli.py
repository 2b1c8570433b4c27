"""`rmscore score` and `rmscore info` as a user runs them, against real servers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import servers
from test_client import (HTTP_KIND, MANIFEST, assert_scores, free_port, local_tokenizer, ort_scores, rollout,
                         shared_server)

RMSCORE = [sys.executable, "-m", "rmscore.cli"]
GRPC_KIND = "py-grpc-onnxruntime"


def run(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(RMSCORE + list(args), capture_output=True, text=True, timeout=300, input=stdin,
                          cwd=servers.ROOT)


@pytest.fixture(scope="module", params=[GRPC_KIND, HTTP_KIND])
def server(request):
    return shared_server(request.param)


def flags(server) -> list[str]:
    return ["--target", server.target] + (["--http"] if server.transport == "http" else [])


def test_score_file_in_input_order(server, tmp_path):
    seqs = rollout(150, 4, 12, seed=21)
    pairs = [("why is the sky blue?", "light scatters."), ("hi", ""), ("Café?", "naïve résumé 🙂")]
    lines = [json.dumps({"tokens": s}) for s in seqs[:100]]
    lines += [json.dumps({"prompt": p, "response": r}) for p, r in pairs]
    lines += [""] + [json.dumps({"tokens": s}) for s in seqs[100:]]  # a blank line is skipped
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    p = run("score", *flags(server), "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"),
            "--chunk-size", "16", "--max-concurrency", "4")
    assert p.returncode == 0, p.stderr
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["index"] for o in out] == list(range(len(seqs) + len(pairs)))
    text_ids = [e.ids for e in local_tokenizer().encode_batch(pairs)]
    want = ort_scores(seqs[:100] + text_ids + seqs[100:])
    assert_scores([o["score"] for o in out], want)
    summary = p.stderr.strip().splitlines()[-1]
    assert f"scored {len(out)} sequences" in summary
    for part in ("sequences/s", "latency p50", "p95", "p99", "requests", MANIFEST["version"]):
        assert part in summary, summary
    assert "it/s" in p.stderr or "seq/s" in p.stderr  # the progress bar


def test_score_bad_input_names_the_line(server, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"tokens": [101, 102]}\n{"tokens": "nope"}\n')
    p = run("score", *flags(server), "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"))
    assert p.returncode == 2 and "line 2" in p.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_score_server_refusal_is_reported(server, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"tokens": [101, 40000, 102]}\n')
    p = run("score", *flags(server), "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"))
    assert p.returncode == 1
    assert "InvalidInput" in p.stderr and "40000" in p.stderr


def test_score_stdin_to_stdout(server):
    p = run("score", *flags(server), "--input", "-", "--output", "-", "--no-progress",
            stdin='{"tokens": [101, 2000, 102]}\n')
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.splitlines()
    assert_scores([json.loads(line)["score"]], ort_scores([[101, 2000, 102]]))


def test_info_prints_model_and_health(server):
    p = run("info", *flags(server), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["version"] == MANIFEST["version"] and info["health"].startswith("SERVING")
    assert info["max_sequence_length"] == MANIFEST["max_sequence_length"]
    p = run("info", *flags(server))
    assert p.returncode == 0 and "vocab_size" in p.stdout and "SERVING" in p.stdout


def test_info_unreachable_fails():
    p = run("info", "--target", f"127.0.0.1:{free_port()}", "--timeout", "2", "--retries", "1")
    assert p.returncode == 1 and "no serving replica reachable" in p.stdout
