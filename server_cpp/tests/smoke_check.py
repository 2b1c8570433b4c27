"""End-to-end check of a real rmscore-server-cpp process over loopback.

Starts the binary on ephemeral ports, then checks: golden parity (alone, and
all in one request), health (SERVING), reflection, every error case of
docs/contract.md, ScoreStream, model info, metric names from metrics.json,
concurrency, queue-full refusal, and the SIGTERM drain (accepted work
finished, exit 0). Exits non-zero on the first failure.

    .venv/bin/python server_cpp/tests/smoke_check.py --binary build/cpp/rmscore-server-cpp --model models/default
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rmscore.v1 import reward_pb2 as pb, reward_pb2_grpc as pbg

ROOT = pathlib.Path(__file__).resolve().parents[2]


def start(binary: str, model: str, *extra: str) -> tuple[subprocess.Popen, dict, float]:
    port_file = pathlib.Path(tempfile.mkdtemp()) / "ports.json"
    t0 = time.monotonic()
    proc = subprocess.Popen([binary, "--model", model, "--port", "0", "--metrics-port", "0",
                             "--port-file", str(port_file), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not port_file.exists():
        if proc.poll() is not None:
            sys.exit(f"server exited early: {proc.stdout.read()}")
        time.sleep(0.02)
    ports = json.loads(port_file.read_text())
    ch = grpc.insecure_channel(f"127.0.0.1:{ports['port']}")
    health = health_pb2_grpc.HealthStub(ch)
    while True:
        try:
            if health.Check(health_pb2.HealthCheckRequest(service="rmscore.v1.RewardModel"),
                            timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError:
            pass
        if proc.poll() is not None:
            sys.exit(f"server exited before SERVING: {proc.stdout.read()}")
        time.sleep(0.02)
    return proc, ports, time.monotonic() - t0


def tokens(ids) -> pb.Sequence:
    return pb.Sequence(tokens=pb.TokenIds(ids=ids))


def expect_error(call, code: grpc.StatusCode, fragment: str) -> None:
    try:
        call()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        assert fragment in e.details(), (fragment, e.details())
        return
    raise AssertionError(f"expected {code} {fragment!r}")


def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "build/cpp/rmscore-server-cpp"))
    ap.add_argument("--model", default=str(ROOT / "models/default"))
    args = ap.parse_args()
    manifest = json.loads((pathlib.Path(args.model) / "manifest.json").read_text())
    golden = manifest["golden"]
    vocab, max_len = manifest["vocab_size"], manifest["max_sequence_length"]

    proc, ports, startup_s = start(args.binary, args.model)
    print(f"started: ports={ports} startup_to_serving_s={startup_s:.2f}")
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{ports['port']}")
        stub = pbg.RewardModelStub(ch)

        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        assert (info.server, info.backend, info.accepts_text) == ("cpp-grpc", "onnxruntime", False), info
        assert info.version == manifest["version"] and info.vocab_size == vocab
        tok_path = pathlib.Path(args.model) / manifest["tokenizer"]["file"]
        assert info.tokenizer_json == tok_path.read_text()

        # Parity: each golden alone, then all in one request (padded together).
        diffs = []
        for g in golden:
            r = stub.Score(pb.ScoreRequest(sequences=[tokens(g["input_ids"])]))
            diffs.append(abs(r.scores[0] - g["score"]))
            assert r.model_version == manifest["version"]
        r = stub.Score(pb.ScoreRequest(sequences=[tokens(g["input_ids"]) for g in golden]))
        diffs += [abs(s - g["score"]) for s, g in zip(r.scores, golden)]
        t = r.timings
        assert t.total_ms > 0 and t.inference_ms > 0 and abs(t.queue_ms - (t.total_ms - t.inference_ms)) < 1e-6, t
        print(f"parity: max_abs_diff={max(diffs):.3g} over {len(diffs)} scores")
        assert max(diffs) <= 1e-5

        # Concurrency: many clients, scores unchanged whatever the batching.
        def one(i):
            g = golden[i % len(golden)]
            return abs(stub.Score(pb.ScoreRequest(sequences=[tokens(g["input_ids"])] * 3)).scores[2] - g["score"])
        with cf.ThreadPoolExecutor(32) as ex:
            worst = max(ex.map(one, range(400)))
        print(f"concurrency: 400 calls, max_abs_diff={worst:.3g}")
        assert worst <= 1e-5

        # Errors.
        IA = grpc.StatusCode.INVALID_ARGUMENT
        score = lambda *seqs, **kw: (lambda: stub.Score(pb.ScoreRequest(sequences=list(seqs), **kw)))
        expect_error(score(), IA, "sequences: empty request, send at least one sequence")
        expect_error(score(tokens([1]), pb.Sequence()), IA, "sequences[1]: no input set, send tokens or text")
        expect_error(score(tokens([])), IA, "sequences[0].tokens.ids: empty sequence")
        expect_error(score(tokens([1, vocab])), IA,
                     f"sequences[0].tokens.ids[1]: token id {vocab} is outside the vocabulary [0, {vocab})")
        long_ids = [golden[0]["input_ids"][0]] * (max_len + 5)
        expect_error(score(tokens(long_ids)), IA,
                     f"sequences[0]: length {max_len + 5} exceeds max_sequence_length {max_len}")
        stub.Score(pb.ScoreRequest(sequences=[tokens(long_ids)], truncation=pb.TRUNCATION_LEFT))
        expect_error(score(*[tokens([1])] * 1025), IA, "sequences: 1025 sequences exceed max_sequences_per_request 1024")
        text = pb.Sequence(text=pb.TextPair(prompt="p", response="r"))
        expect_error(score(tokens([1]), text), IA, "sequences[1]: mixes text and token ids")
        expect_error(score(text), IA, "sequences[0].text: this server does not tokenize text; send token ids")
        huge = pb.Sequence(text=pb.TextPair(prompt="x" * (17 << 20)))  # > --max-request-bytes 16 MiB
        expect_error(score(huge), grpc.StatusCode.RESOURCE_EXHAUSTED, "")
        print("errors: all contract cases answered with their codes and messages")

        # Stream: every item answered with its id; a bad item gets `error`.
        items = [pb.ScoreStreamRequest(id=f"g{i}", sequence=tokens(g["input_ids"])) for i, g in enumerate(golden)]
        items.append(pb.ScoreStreamRequest(id="bad", sequence=tokens([-3])))
        got = {a.id: a for a in stub.ScoreStream(iter(items))}
        assert set(got) == {it.id for it in items}, got.keys()
        assert got["bad"].WhichOneof("result") == "error" and got["bad"].error.code == 3, got["bad"]
        assert "sequence.tokens.ids[0]: token id -3" in got["bad"].error.message
        for i, g in enumerate(golden):
            assert abs(got[f"g{i}"].score - g["score"]) <= 1e-5
        print("stream: ok")

        # Reflection lists the service.
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in resp.list_services_response.service}
        assert "rmscore.v1.RewardModel" in names and "grpc.health.v1.Health" in names, names
        print(f"reflection: {sorted(names)}")

        # Metrics: every name of metrics.json, with our labels.
        text = urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics_port']}/metrics", timeout=5).read().decode()
        spec = json.loads((ROOT / "server_py/rmscore/metrics.json").read_text())
        for m in spec["metrics"]:
            assert f"# TYPE {m['name']} {m['type']}" in text, m["name"]
        lines = [ln for ln in text.splitlines() if ln.startswith("rmscore_requests_total{")]
        by_code = {c: ln for ln in lines for c in ("OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
                   if f'code="{c}"' in ln}
        assert set(by_code) == {"OK", "INVALID_ARGUMENT"}, lines  # too-large is refused by gRPC itself
        assert all('server="cpp-grpc"' in ln and 'backend="onnxruntime"' in ln for ln in lines), lines
        assert float(by_code["OK"].split()[-1]) >= 400, by_code
        print("metrics: all names present")

        time.sleep(0.5)
        print(f"idle RSS: {rss_kib(proc.pid) / 1024:.1f} MiB")

        # SIGTERM while work is in flight: accepted calls finish OK, then exit 0.
        short = [g["input_ids"] for g in golden if len(g["input_ids"]) <= 64]  # 2 CPU cores: keep it seconds
        big = pb.ScoreRequest(sequences=[tokens(ids) for ids in short] * 3)
        with cf.ThreadPoolExecutor(8) as ex:
            futs = [ex.submit(stub.Score, big, timeout=60) for _ in range(8)]
            time.sleep(0.05)
            t_sig = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            results = []
            for f in futs:
                try:
                    results.append(("OK", len(f.result().scores)))
                except grpc.RpcError as e:
                    results.append((e.code().name, e.details()))
        rc = proc.wait(timeout=40)
        print(f"drain: exit={rc} in {time.monotonic() - t_sig:.2f}s results={sorted(set(r[0] for r in results))}")
        assert rc == 0
        assert all(r[0] in ("OK", "UNAVAILABLE") for r in results), results
        assert all(r[1] == "not ready: draining" for r in results if r[0] == "UNAVAILABLE"), results
        log = proc.stdout.read()
        print(log)
        assert "drained=true" in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
    print("SMOKE OK")


if __name__ == "__main__":
    main()
