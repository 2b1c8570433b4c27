"""The conformance suite: every server kind, as a real process on loopback, held to docs/contract.md.

RMSCORE_TEST_KINDS=cpp-grpc,py-http-onnxruntime narrows the kinds.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import re
import shutil
import signal
import threading
import time

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import servers
from harness import GOLDEN_IDS, GOLDEN_SCORES, MANIFEST, MAX_LEN, ROOT, VOCAB, Caller, CallError, pb, pbg
from rmscore.core.metrics import SPEC
from rmscore.model.padding import pad_batch
from rmscore_tools.observe import metric
from rmscore_tools.reliability.transport import expected_wait_s

KINDS = servers.available_kinds()
# Limits small enough that the overload test can fill the queue.
FLAGS = dict(max_queue_sequences=256, max_sequences_per_request=128, max_batch_size=16)


@pytest.fixture(scope="module", params=KINDS)
def server(request):
    s = servers.start(request.param, **FLAGS)
    yield s
    s.stop()


@pytest.fixture
def call(server):
    c = Caller(server)
    yield c
    c.close()


@pytest.fixture(scope="module")
def reference():
    """In-process ONNX Runtime, each sequence alone: the scoring rule every server must meet."""
    sess = ort.InferenceSession(str(ROOT / "models/default/model.onnx"), providers=["CPUExecutionProvider"])

    def score(seqs):
        return np.array([sess.run(["scores"], dict(zip(("input_ids", "attention_mask"), pad_batch([s], 0))))[0][0]
                         for s in seqs])
    return score


def tolerance(kind: str) -> float:
    return 1e-4 if "compile" in kind else 1e-5


def rand_seqs(n, lo=1, hi=96, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def tokens(seqs):
    return [{"tokens": s} for s in seqs]


# ---- scores --------------------------------------------------------------------------------

def test_golden_scores_in_order(server, call):
    scores = np.array(call.score(tokens(GOLDEN_IDS)))
    assert np.abs(scores - GOLDEN_SCORES).max() <= tolerance(server.kind)
    rev = np.array(call.score(tokens(GOLDEN_IDS[::-1])))
    assert np.abs(rev[::-1] - GOLDEN_SCORES).max() <= tolerance(server.kind)


def test_response_carries_version_and_timings(server, call):
    r = call.score_full(tokens(GOLDEN_IDS[:3]))
    assert r["model_version"] == MANIFEST["version"]
    t = r["timings"]
    assert t["total_ms"] > 0 and 0 < t["inference_ms"] <= t["total_ms"] + 1e-6
    assert abs(t["queue_ms"] - (t["total_ms"] - t["inference_ms"])) < 1e-3


def test_mixed_lengths_match_each_alone(server, call, reference):
    seqs = rand_seqs(40, 1, 300, seed=1)
    got = np.array(call.score(tokens(seqs)))
    assert np.abs(got - reference(seqs)).max() <= 1e-4


def test_many_concurrent_clients_all_answered_correctly(server, reference):
    reqs = [rand_seqs(random.Random(i).randint(1, 12), 4, 64, seed=100 + i) for i in range(24)]
    want = [reference(r) for r in reqs]

    def one(i):
        c = Caller(server)
        try:
            return np.array(c.score(tokens(reqs[i])))
        finally:
            c.close()

    with cf.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(one, range(len(reqs))))
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.abs(g - w).max() <= 1e-4


def test_truncation_cuts_the_named_side(server, call, reference):
    long = rand_seqs(1, MAX_LEN + 40, MAX_LEN + 40, seed=3)[0]
    left, right = call.score(tokens([long]), "left")[0], call.score(tokens([long]), "right")[0]
    want = reference([long[-MAX_LEN:], long[:MAX_LEN]])
    assert abs(left - want[0]) <= 1e-4 and abs(right - want[1]) <= 1e-4
    # The longest input truncation takes: 64 x max_sequence_length ids (docs/contract.md, Input bounds).
    longest = long * (64 * MAX_LEN // len(long)) + long[:64 * MAX_LEN % len(long)]
    assert len(longest) == 64 * MAX_LEN
    assert abs(call.score(tokens([longest]), "left")[0] - reference([longest[-MAX_LEN:]])[0]) <= 1e-4


def test_text_input(server, call):
    pair = {"prompt": "Explain why the sky is blue.", "response": "Rayleigh scattering."}
    info = call.info()
    if not info["accepts_text"]:
        with pytest.raises(CallError) as e:
            call.score([pair])
        assert e.value.code == "INVALID_ARGUMENT" and "send token ids" in e.value.message
        return
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(ROOT / "models/default/tokenizer.json"))
    ids = tok.encode(pair["prompt"], pair["response"]).ids
    assert call.score([pair]) == pytest.approx(call.score(tokens([ids])), abs=1e-6)


# ---- bad input -----------------------------------------------------------------------------

BAD = [
    ("empty request", [], "none", r"^sequences: empty request"),
    ("no input set", [{"tokens": [5]}, {}], "none", r"^sequences\[1\]: no input set"),
    ("empty sequence", [{"tokens": []}], "none", r"^sequences\[0\]\.tokens\.ids: empty sequence"),
    ("negative id", [{"tokens": [101, -3, 7]}], "none",
     r"^sequences\[0\]\.tokens\.ids\[1\]: token id -3 is outside the vocabulary \[0, 30522\)"),
    ("id past vocab", [{"tokens": [1]}, {"tokens": [101, 7, 30522]}], "none",
     r"^sequences\[1\]\.tokens\.ids\[2\]: token id 30522 is outside the vocabulary"),
    ("huge id", [{"tokens": [2**62]}], "none", r"token id 4611686018427387904 is outside"),
    ("too long", [{"tokens": [7] * (MAX_LEN + 1)}], "none",
     rf"^sequences\[0\]: length {MAX_LEN + 1} exceeds max_sequence_length {MAX_LEN} \(set truncation"),
    # Refused even with truncation, not held whole until answered (before: kept whole while queued).
    ("longer than truncation may cut", [{"tokens": [7] * (64 * MAX_LEN + 1)}], "left",
     rf"^sequences\[0\]\.tokens\.ids: length {64 * MAX_LEN + 1} exceeds {64 * MAX_LEN}, the most a sequence may "
     rf"send even with truncation \(64 x max_sequence_length {MAX_LEN}\)"),
    ("too many", [{"tokens": [7]}] * (FLAGS["max_sequences_per_request"] + 1), "none",
     rf"^sequences: {FLAGS['max_sequences_per_request'] + 1} sequences exceed max_sequences_per_request"),
    ("mixed kinds", [{"tokens": [7]}, {"prompt": "a", "response": "b"}], "none",
     r"^sequences\[1\]: mixes text and token ids"),
]


@pytest.mark.parametrize("case,seqs,trunc,pattern", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_invalid_argument(server, call, case, seqs, trunc, pattern):
    with pytest.raises(CallError) as e:
        call.score(seqs, trunc)
    assert e.value.code == "INVALID_ARGUMENT", e.value
    assert re.search(pattern, e.value.message), e.value.message
    assert call.score(tokens(GOLDEN_IDS[:2])) == pytest.approx(list(GOLDEN_SCORES[:2]), abs=1e-4)


def test_malformed_json_is_422(server):
    if server.transport != "http":
        pytest.skip("JSON decoding is the HTTP front end's")
    c = Caller(server)
    for raw, where in ((b'{"sequences": [', "body"), (b'{"sequences": [{"tokens": ["x"]}]}', "sequences.0.tokens.0"),
                       (b'{"sequences": [], "extra": 1}', "extra")):
        with pytest.raises(CallError) as e:
            c.post(None, raw=raw)
        assert e.value.code == "INVALID_ARGUMENT" and where in e.value.message, e.value
    # A JSON body without a JSON Content-Type (curl -d sends a form's) is not decoded: the answer says
    # that the header is what is wrong (before: "body: Input should be a valid dictionary ...").
    good = json.dumps({"sequences": [{"tokens": [101, 102]}]}).encode()
    for ctype in ("", "application/x-www-form-urlencoded", "text/plain"):
        r = c.http("POST", "/rmscore/v1/score", good, headers={"content-type": ctype})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert message.startswith("body: not read as JSON: Content-Type is ") and \
            "send Content-Type: application/json" in message and repr(ctype or "missing") in message, message
    assert c.http("POST", "/rmscore/v1/score", good, headers={"content-type": "application/json; charset=utf-8"}) \
        .status_code == 200


# ---- overload and deadlines ---------------------------------------------------------------

def test_overload_is_refused_fast_and_nothing_is_lost(server):
    heavy = rand_seqs(FLAGS["max_sequences_per_request"], 48, 96, seed=9)
    outcomes = []

    def one(_):
        c = Caller(server)
        t0 = time.perf_counter()
        try:
            n = len(c.score(tokens(heavy), timeout_s=300))
            return ("OK", n, time.perf_counter() - t0)
        except CallError as e:
            return (e.code, e.message, time.perf_counter() - t0)
        finally:
            c.close()

    with cf.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(8)))
    refused = [o for o in outcomes if o[0] == "RESOURCE_EXHAUSTED"]
    ok = [o for o in outcomes if o[0] == "OK"]
    assert len(refused) + len(ok) == 8, outcomes
    assert refused and ok, outcomes
    assert all(o[1] == len(heavy) for o in ok)
    assert all("queue full" in o[1] for o in refused)
    assert max(o[2] for o in refused) < 1.0, refused  # refused at once, not after queueing


def _dropped_total(server) -> float:
    return sum(metric(server, "rmscore_sequences_dropped_total", reason=r) for r in ("deadline", "cancelled"))


class _Busy:
    """One request of long sequences, sent with no deadline: the queue holds seconds of model work
    meanwhile. Its caller abandons it after `busy_s` (gRPC: the call cancelled; HTTP: the client hangs
    up), and the server drops what is still queued, so the test does not wait for all of it to be
    scored. A deadline would not do: admission refuses at once a request whose last sequence its
    deadline cannot hold (docs/contract.md)."""

    BUSY_S = 4.0

    def __init__(self, server, n: int = 128, busy_s: float = BUSY_S):
        self.caller = Caller(server)
        self.t0, self.busy_s = time.monotonic(), busy_s
        self.thread = threading.Thread(target=self._run, args=(rand_seqs(n, 400, 500, seed=5), server))
        self.outcome = None
        self.thread.start()
        end = time.monotonic() + 30
        while expected_wait_s(server) < 0.5 and self.thread.is_alive() and time.monotonic() < end:
            time.sleep(0.02)
        self.wait_s = expected_wait_s(server)

    def _run(self, seqs, server):
        if server.transport == "grpc":
            from rmscore_tools.caller import score_request
            fut = self.caller.stub.Score.future(score_request(tokens(seqs)))  # no deadline
            try:
                self.outcome = len(fut.result(timeout=self.busy_s).scores)
            except grpc.FutureTimeoutError:
                fut.cancel()
                self.outcome = "abandoned"
            return
        import httpx
        try:  # no timeout_ms: no deadline; the client hangs up after busy_s
            r = httpx.post(server.base_url + "/rmscore/v1/score", json={"sequences": tokens(seqs)}, timeout=self.busy_s)
            self.outcome = len(r.json()["scores"])
        except httpx.ReadTimeout:
            self.outcome = "abandoned"

    def join(self):
        self.thread.join()
        self.caller.close()
        assert self.outcome in (128, "abandoned"), self.outcome  # scored, or abandoned by its caller


def test_a_deadline_shorter_than_the_queued_work_is_refused_at_once(server):
    """Admission by work (docs/contract.md): the server knows the model time queued ahead and refuses a
    request that cannot be scored before its deadline at once, instead of holding it until it expires."""
    busy = _Busy(server)
    try:
        assert busy.wait_s >= 0.5, f"the queue never held 0.5 s of work ({busy.wait_s} s)"
        # The work ahead is the caller's (docs/contract.md, "Shares per caller"). On gRPC these calls are
        # the busy caller's own (grpcio shares one connection among channels to a target), so its queued
        # work is ahead of them. On HTTP a connection carries one request at a time: a new request's
        # caller has nothing queued, and only the batch running is ahead of it, so its deadline is 1 ms.
        short_s = min(0.4, busy.wait_s / 2) if server.transport == "grpc" else 0.001
        t0 = time.perf_counter()
        with pytest.raises(CallError) as e:
            Caller(server).score(tokens(GOLDEN_IDS[:1]), timeout_s=short_s)
        took = time.perf_counter() - t0
        assert e.value.code == "DEADLINE_EXCEEDED" and "ms of model work waiting" in e.value.message, e.value
        assert took < 0.3, took  # a fresh connection included
        # Refused before its ids are read (docs/contract.md, order of checks): an id outside the
        # vocabulary is not what the caller hears while the work ahead outlasts its deadline.
        with pytest.raises(CallError) as e:
            Caller(server).score(tokens([[MANIFEST["vocab_size"] + 5] * 8]), timeout_s=short_s)
        assert e.value.code == "DEADLINE_EXCEEDED" and "ms of model work waiting" in e.value.message, e.value
        # A deadline with room for the work ahead is accepted and scored.
        assert len(Caller(server).score(tokens(GOLDEN_IDS[:1]), timeout_s=busy.wait_s + 10)) == 1
    finally:
        busy.join()


def test_abandoned_sequences_are_dropped_before_the_model(server):
    """A caller that gives up while its sequences wait: they leave the queue, counted, never scored."""
    before = _dropped_total(server)
    busy = _Busy(server, busy_s=10.0)
    try:
        # Long enough to be still waiting when the caller goes, on every transport: whether it shares the
        # busy caller's connection or not (grpcio may or may not reuse one for a new channel), its
        # sequences take turns with the busy caller's (docs/contract.md, "Shares per caller"), so a
        # short request would be scored before it is abandoned (a run met it: fut.cancel() False).
        body = tokens(rand_seqs(8, 400, 500, seed=6))
        if server.transport == "grpc":
            from rmscore_tools.caller import score_request
            with grpc.insecure_channel(server.target) as ch:
                fut = pbg.RewardModelStub(ch).Score.future(score_request(body))  # no deadline
                time.sleep(0.2)
                assert fut.cancel()
        else:
            import httpx
            with pytest.raises(httpx.ReadTimeout):  # no timeout_ms: the client just hangs up
                httpx.post(server.base_url + "/rmscore/v1/score", json={"sequences": body}, timeout=0.3)
        # Seen before the busy request's own deadline, whose expiry would drop sequences too.
        end = busy.t0 + busy.busy_s - 0.5
        while _dropped_total(server) < before + 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert _dropped_total(server) >= before + 2 and time.monotonic() < end
    finally:
        busy.join()


# ---- model info, health, reflection, metrics ----------------------------------------------

def test_model_info(server, call):
    info = call.info()
    for key in ("name", "version", "architecture", "family", "pooling", "max_sequence_length",
                "pad_token_id", "vocab_size"):
        assert info[key] == MANIFEST[key], key
    assert info["max_sequences_per_request"] == FLAGS["max_sequences_per_request"]
    assert info["server"] in ("cpp-grpc", "py-grpc", "py-http")
    if server.transport == "grpc":
        from tokenizers import Tokenizer
        assert Tokenizer.from_str(info["tokenizer_json"]).get_vocab_size() == VOCAB


def test_health_and_reflection(server):
    if server.transport != "grpc":
        import httpx
        assert httpx.get(server.base_url + "/readyz").status_code == 200
        assert httpx.get(server.base_url + "/healthz").status_code == 200
        return
    with grpc.insecure_channel(server.target) as ch:
        for name in ("", "rmscore.v1.RewardModel"):
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        answers = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for a in answers for s in a.list_services_response.service}
    assert {"rmscore.v1.RewardModel", "grpc.health.v1.Health"} <= names


def test_metric_names_and_labels(server, call):
    call.score(tokens(GOLDEN_IDS[:2]))
    with pytest.raises(CallError):
        call.score([])
    text = server.metrics_text()
    kind = {"cpp-grpc": "cpp-grpc", "py-http-onnxruntime": "py-http"}.get(server.kind, "py-grpc")
    for m in SPEC["metrics"]:
        series = m["name"] + ("_count" if m["type"] == "histogram" else "")
        lines = [ln for ln in text.splitlines() if ln.startswith(series + "{")]
        assert lines, f"{series} missing from /metrics"
        # the conformance servers run with the default --device cpu
        assert all(f'server="{kind}"' in ln and 'backend="' in ln and 'device="cpu"' in ln for ln in lines), lines
    # the --max-queue-sequences it runs with, which the queue alert divides by
    cap = FLAGS["max_queue_sequences"]
    assert metric(server, "rmscore_queue_capacity_sequences") == cap, cap
    for m in SPEC["process_metrics"]:  # the client libraries' own names, no labels, a number
        assert re.search(rf"^{m['name']} [0-9.e+]+$", text, re.M), f"{m['name']} missing from /metrics"
    # the two calls above, counted by their code
    assert metric(server, "rmscore_requests_total", code="INVALID_ARGUMENT") >= 1
    assert metric(server, "rmscore_requests_total", code="OK") >= 1


def test_stream_answers_each_item_with_its_id(server):
    if server.transport != "grpc":
        pytest.skip("ScoreStream is gRPC")
    items = [pb.ScoreStreamRequest(id=f"r{i}", sequence=pb.Sequence(tokens=pb.TokenIds(ids=s)))
             for i, s in enumerate(GOLDEN_IDS[:6])]
    items.insert(3, pb.ScoreStreamRequest(id="bad", sequence=pb.Sequence(tokens=pb.TokenIds(ids=[VOCAB + 1]))))
    with grpc.insecure_channel(server.target) as ch:
        out = list(pbg.RewardModelStub(ch).ScoreStream(iter(items), timeout=60))
    by_id = {o.id: o for o in out}
    assert len(out) == len(items) and set(by_id) == {i.id for i in items}
    assert by_id["bad"].WhichOneof("result") == "error" and by_id["bad"].error.code == 3
    assert by_id["bad"].error.message.startswith("sequence.tokens.ids[0]: token id")
    for i in range(6):
        assert abs(by_id[f"r{i}"].score - GOLDEN_SCORES[i]) <= tolerance(server.kind)


# ---- start-up and shutdown (fresh processes) ----------------------------------------------

def test_refuses_to_serve_when_the_self_check_fails(server, tmp_path):
    if server.kind == "py-grpc-compile":
        pytest.skip("the start-up and shutdown paths are py-grpc-eager's (same core and transport); spares a compile warm-up")
    bad = tmp_path / "tampered"
    shutil.copytree(ROOT / "models/default", bad, ignore=shutil.ignore_patterns("model.int8.onnx", "hf"))
    (bad / "hf").symlink_to(ROOT / "models/default/hf")
    m = json.loads((bad / "manifest.json").read_text())
    m["golden"][0]["score"] += 0.5
    (bad / "manifest.json").write_text(json.dumps(m))
    s = servers.start(server.kind, wait_ready=False, model=bad, **FLAGS)
    seen = []
    try:
        while s.proc.poll() is None and len(seen) < 3000:
            seen.append(servers.is_ready(s))
            time.sleep(0.02)
        assert s.proc.wait(120) != 0
    finally:
        s.stop(5)
    assert not any(seen)
    assert "self-check" in s.log(), s.log()


def test_sigterm_drains_accepted_requests(server):
    if server.kind == "py-grpc-compile":
        pytest.skip("the start-up and shutdown paths are py-grpc-eager's (same core and transport); spares a compile warm-up")
    s = servers.start(server.kind, drain_grace_seconds=120, **FLAGS)
    reqs = [rand_seqs(12, 32, 128, seed=50 + i) for i in range(6)]
    threads, results = _score_in_threads(s, reqs, timeout_s=300)
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    time.sleep(0.3)
    late = Caller(s)
    try:
        with pytest.raises(CallError) as e:
            late.score(tokens(GOLDEN_IDS[:1]), timeout_s=10)
        assert e.value.code == "UNAVAILABLE", e.value
    finally:
        late.close()
    for t in threads:
        t.join(120)
    assert s.proc.wait(60) == 0, s.log()
    assert time.monotonic() - t0 < 120
    assert results == [("OK", 12)] * len(reqs), results


def test_sigterm_when_the_grace_runs_out_every_call_ends_and_the_exit_is_on_time(server):
    if server.kind == "py-grpc-compile":
        pytest.skip("the shutdown path is py-grpc-eager's (same core and transport); spares a compile warm-up")
    # Far more accepted work than a 4 s grace can finish (128 sequences of 256 tokens: tens of
    # seconds here): the server must still exit within the grace, and every call must end with
    # an answer that says why, none left hanging or cut off without a status.
    grace_s = 4.0
    s = servers.start(server.kind, drain_grace_seconds=grace_s, **FLAGS)
    reqs = [rand_seqs(64, 256, 256, seed=70 + i) for i in range(2)]
    threads, results = _score_in_threads(s, reqs, timeout_s=120)
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    code = s.proc.wait(60)
    exit_s = time.monotonic() - t0
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a call never ended"
    assert code == 0, s.log()
    assert exit_s < grace_s + 2.5, (exit_s, s.log())  # slack for process teardown on a busy machine
    # Queued work fails "not ready: draining"; the C++ server also aborts the batch in the model
    # (INTERNAL). A batch that finished in time may have answered a request whole.
    for r in results:
        assert r == ("UNAVAILABLE", "not ready: draining") or r[0] == "INTERNAL" or r == ("OK", 64), results
    assert any(r[0] != "OK" for r in results), results  # the grace did run out


def _score_in_threads(s, reqs, timeout_s):
    """One Score call per request, each from its own thread; returns once all are in flight. The
    results list fills with ("OK", n scores) or (code, message) as the calls end."""
    results = [None] * len(reqs)

    def one(i):
        c = Caller(s)
        try:
            results[i] = ("OK", len(c.score(tokens(reqs[i]), timeout_s=timeout_s)))
        except CallError as e:
            results[i] = (e.code, e.message)
        except Exception as e:  # noqa: BLE001 - a call cut off below the contract (reset, closed socket)
            results[i] = ("TRANSPORT", repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    _wait_in_flight(s, len(reqs))
    return threads, results


def _wait_in_flight(s, n, timeout_s=60):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if metric(s, "rmscore_requests_in_flight") >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"{n} requests never in flight together")
