"""rmscore_client against real servers on loopback.

Per gRPC server kind two replicas run for the whole module: `b` (from servers.start)
and `a`, launched here on a fixed port so a test can SIGKILL it and start it again on
the same port; `a` also has a small queue (max_queue_sequences=128) so overload is
easy to provoke. Scores are checked against ONNX Runtime run in this process on
models/default/model.onnx (padded batches, attention mask), to 1e-4.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import os
import random
import signal
import socket
import threading
import time

import grpc
import numpy as np
import pytest

import servers
from rmscore_client import (NO_RETRY, AsyncHttpRewardClient, AsyncRewardClient, DeadlineExceeded,
                            HttpRewardClient, InvalidInput, Overloaded, RetryPolicy, RewardClient, ScoreResult,
                            Unavailable)
from rmscore_tools.observe import metric

MODEL = servers.MODEL
MANIFEST = json.loads((MODEL / "manifest.json").read_text())
TOL = 1e-4
# The client is the same whatever the backend: by default the Python (ONNX Runtime) and C++ gRPC
# servers; RMSCORE_TEST_KINDS=... runs the gRPC kinds it names (py-grpc-eager, ... too).
GRPC_KINDS = [k for k in servers.available_kinds() if servers.launch.transport(k) == "grpc"
              and (os.environ.get("RMSCORE_TEST_KINDS") or k in ("py-grpc-onnxruntime", "cpp-grpc"))]
HTTP_KIND = "py-http-onnxruntime"
# gRPC shares subchannels between a process's channels; a pick_first channel that must choose
# the first address (not whichever shared subchannel is READY first) keeps its own.
PRIVATE_SUBCHANNELS = [("grpc.use_local_subchannel_pool", 1)]
SMALL_QUEUE = {"max_queue_sequences": 128, "max_sequences_per_request": 64}


# ---- servers shared by the client test modules ---------------------------------------------
_SHARED: dict[str, servers.RunningServer] = {}
_SHARED_LOCK = threading.Lock()


def shared_server(kind: str) -> servers.RunningServer:
    """One default-flag server per kind for every client test module in this run (stopped at exit)."""
    with _SHARED_LOCK:
        s = _SHARED.get(kind)
        if s is None or s.proc.poll() is not None:
            s = _SHARED[kind] = servers.start(kind)
        return s


@atexit.register
def _stop_shared() -> None:
    for s in _SHARED.values():
        s.stop(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FixedPortReplica:
    """A server on a port chosen once, so it can be killed and started again on that same port."""

    def __init__(self, kind: str, **flags):
        self.kind, self.flags, self.port = kind, flags, free_port()
        self.server: servers.RunningServer | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 400) -> servers.RunningServer:
        self.server = servers.start(self.kind, self.port, ready_timeout_s=ready_timeout_s, **self.flags)
        return self.server

    def kill(self) -> None:
        self.server.signal(signal.SIGKILL)
        self.server.proc.wait(30)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(20)


# ---- reference scores -----------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _session():
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(MODEL / "model.onnx"), so, providers=["CPUExecutionProvider"])


def ort_scores(seqs: list[list[int]], batch: int = 64) -> list[float]:
    """Direct ONNX Runtime scores: length-sorted batches padded with pad_token_id, with a mask."""
    pad = MANIFEST["pad_token_id"]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [0.0] * len(seqs)
    for k in range(0, len(order), batch):
        idx = order[k:k + batch]
        width = max(len(seqs[i]) for i in idx)
        ids = np.full((len(idx), width), pad, np.int64)
        mask = np.zeros((len(idx), width), np.int64)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = seqs[i]
            mask[r, :len(seqs[i])] = 1
        got = _session().run(["scores"], {"input_ids": ids, "attention_mask": mask})[0]
        for r, i in enumerate(idx):
            out[i] = float(got[r])
    return out


def rollout(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """n distinct [CLS] ... [SEP] sequences of lengths lo..hi (ids from the ordinary vocabulary)."""
    rng = random.Random(seed)
    return [[101] + [rng.randrange(1000, 30000) for _ in range(rng.randint(lo, hi) - 2)] + [102] for _ in range(n)]


@functools.lru_cache(maxsize=None)
def rollout_with_reference(n: int, lo: int, hi: int, seed: int):
    seqs = rollout(n, lo, hi, seed)
    return seqs, ort_scores(seqs)


def assert_scores(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    diff = np.abs(np.asarray(got) - np.asarray(want))
    worst = int(diff.argmax())
    assert diff[worst] <= TOL, f"score {worst}: {got[worst]} vs reference {want[worst]}"


def texts(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    words = "the a reward model scores each response to a prompt quickly and fairly why is sky blue " \
            "light scatters short wavelengths more than long ones cafe naive resume".split()
    prompts = [" ".join(rng.choices(words, k=rng.randint(2, 8))) + "?" for _ in range(n)]
    responses = [" ".join(rng.choices(words, k=rng.randint(1, 10))) + "." for _ in range(n)]
    prompts[0], responses[0] = "Café naïve résumé 🙂?", ""  # accents, emoji, empty response
    return prompts, responses


def local_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


# ---- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=GRPC_KINDS)
def replicas(request):
    """(a, b): a on a fixed port with a small queue, b with default flags."""
    kind = request.param
    a = FixedPortReplica(kind, **SMALL_QUEUE)
    a.start()
    try:
        b = shared_server(kind)
        yield a, b
    finally:
        a.stop()


@pytest.fixture
def pair(replicas):
    """`replicas`, with a started again if a test left it stopped."""
    a, b = replicas
    if a.server.proc.poll() is not None:
        a.start()
    return a, b


@pytest.fixture(scope="module")
def http_server():
    return shared_server(HTTP_KIND)


# ---- gRPC ------------------------------------------------------------------------------------
def test_rollout_scores_match_onnxruntime_in_caller_order(pair):
    """A few thousand mixed-length sequences, cut into uneven chunks sent concurrently."""
    _, b = pair
    seqs, want = rollout_with_reference(2000, 4, 16, seed=1)
    seen = []
    with RewardClient(b.target, chunk_size=37, max_concurrency=8) as rm:
        r = rm.score_ids(seqs, on_chunk=seen.append)
    assert isinstance(r, ScoreResult)
    assert_scores(r.scores, want)
    assert r.model_version == MANIFEST["version"] and r.model_versions == {MANIFEST["version"]}
    n_chunks = -(-len(seqs) // 37)
    assert len(r.timings) == n_chunks == len(seen)
    assert [t.offset for t in r.timings] == list(range(0, len(seqs), 37))
    assert sum(t.count for t in r.timings) == len(seqs)
    assert all(t.attempts == 1 and t.total_ms > 0 and t.latency_ms > 0 for t in r.timings)
    # Answers arrived out of order (concurrency), yet the scores are in the caller's order.
    assert sorted(t.offset for t in seen) == [t.offset for t in r.timings]


def test_golden_inputs_match_eager_fp32(pair):
    _, b = pair
    golden = [g for g in MANIFEST["golden"] if len(g["input_ids"]) <= 128]  # the long ones cost ~10 s here
    with RewardClient(b.target, chunk_size=5) as rm:
        r = rm.score_ids([g["input_ids"] for g in golden])
    tol = MANIFEST["parity"]["fp32"]["tolerance"]
    for g, s in zip(golden, r.scores):
        assert abs(s - g["score"]) <= tol


def test_text_tokenized_on_client_equals_ids(pair):
    _, b = pair
    prompts, responses = texts(40, seed=2)
    want_ids = [e.ids for e in local_tokenizer().encode_batch(list(zip(prompts, responses)))]
    with RewardClient(b.target, chunk_size=16) as rm:
        ids = rm.tokenize(prompts, responses)  # the server's tokenizer, from GetModelInfo.tokenizer_json
        assert ids == want_ids
        by_text = rm.score_texts(prompts, responses)
        by_ids = rm.score_ids(want_ids)
    assert by_text.scores == by_ids.scores
    assert_scores(by_text.scores, ort_scores(want_ids))
    with RewardClient(b.target, tokenizer=MODEL / "tokenizer.json") as rm:  # a local tokenizer.json
        assert rm.score_texts(prompts, responses).scores == by_ids.scores


def test_text_on_client_equals_server_side_tokenization(pair):
    """The Python servers tokenize TextPair themselves: the client's ids must give the same scores."""
    _, b = pair
    if b.kind == "cpp-grpc":
        pytest.skip("the C++ server takes token ids only")
    from rmscore_client.v1 import reward_pb2 as pb, reward_pb2_grpc

    prompts, responses = texts(12, seed=3)
    req = pb.ScoreRequest(sequences=[pb.Sequence(text=pb.TextPair(prompt=p, response=r))
                                     for p, r in zip(prompts, responses)])
    with grpc.insecure_channel(b.target) as ch:
        server_side = list(reward_pb2_grpc.RewardModelStub(ch).Score(req, timeout=60).scores)
    with RewardClient(b.target) as rm:
        client_side = rm.score_texts(prompts, responses).scores
    assert np.allclose(client_side, server_side, atol=1e-6, rtol=0)


def test_info_and_health(pair):
    _, b = pair
    with RewardClient(b.target) as rm:
        info = rm.info()
        health = rm.health()
    assert (info.name, info.version, info.vocab_size, info.pad_token_id) == (
        "default", MANIFEST["version"], MANIFEST["vocab_size"], MANIFEST["pad_token_id"])
    assert info.max_sequence_length == MANIFEST["max_sequence_length"]
    assert info.server == ("cpp-grpc" if b.kind == "cpp-grpc" else "py-grpc")
    assert json.loads(info.tokenizer_json)["model"]["type"] == "WordPiece"
    assert health.serving and health.status == "SERVING"
    with RewardClient(f"127.0.0.1:{free_port()}", timeout_s=2) as rm:  # nothing listens there
        assert not rm.health().serving


def test_invalid_input_is_typed_and_sent_once(pair):
    _, b = pair
    before = metric(b, "rmscore_requests_total", code="INVALID_ARGUMENT")
    with RewardClient(b.target, retry=RetryPolicy(max_attempts=5, initial_backoff_s=0.01)) as rm:
        with pytest.raises(InvalidInput) as e:
            rm.score_ids([[101, 2000, 102], [101, 40000, 102]])
    assert e.value.code == "INVALID_ARGUMENT" and e.value.attempts == 1
    assert "sequences[1].tokens.ids[1]" in e.value.message and "40000" in e.value.message
    assert not isinstance(e.value, grpc.RpcError)
    assert metric(b, "rmscore_requests_total", code="INVALID_ARGUMENT") - before == 1


def test_too_long_is_refused_unless_truncation_says_how(pair):
    _, b = pair
    long = [101] + [2000 + i % 50 for i in range(600)] + [102]
    with RewardClient(b.target) as rm:
        with pytest.raises(InvalidInput, match="exceeds max_sequence_length"):
            rm.score_ids([long])
        left = rm.score_ids([long], truncation="left").scores
        right = rm.score_ids([long], truncation="right").scores
    assert_scores(left + right, ort_scores([long[-512:], long[:512]]))


def test_deadline_surfaces_as_typed_error(pair):
    _, b = pair
    seqs = rollout(256, 48, 64, seed=4)
    with RewardClient(b.target, chunk_size=256, timeout_s=0.001) as rm:
        with pytest.raises(DeadlineExceeded) as e:
            rm.score_ids(seqs)
    assert e.value.code == "DEADLINE_EXCEEDED" and e.value.attempts == 1  # never retried
    with RewardClient(b.target) as rm:  # per call, overriding the client's default
        with pytest.raises(DeadlineExceeded):
            rm.score_ids(seqs, timeout_s=0.001)


def test_overload_is_retried_with_backoff_until_scored(pair):
    """a's queue holds 128 sequences; 8 chunks of 64 at once overflow it."""
    a, _ = pair
    seqs, want = rollout_with_reference(512, 6, 10, seed=5)
    before = metric(a.server, "rmscore_requests_total", code="RESOURCE_EXHAUSTED")
    with RewardClient(a.target, chunk_size=64, max_concurrency=8, timeout_s=120,
                      retry=RetryPolicy(max_attempts=40, initial_backoff_s=0.02, max_backoff_s=0.5)) as rm:
        r = rm.score_ids(seqs)
    assert_scores(r.scores, want)
    refused = metric(a.server, "rmscore_requests_total", code="RESOURCE_EXHAUSTED") - before
    retried = sum(t.attempts - 1 for t in r.timings)
    assert refused >= 1 and retried == refused
    with RewardClient(a.target, chunk_size=64, max_concurrency=8, retry=NO_RETRY) as rm:
        with pytest.raises(Overloaded) as e:
            rm.score_ids(seqs)
    assert e.value.code == "RESOURCE_EXHAUSTED" and "queue full" in e.value.message


def test_two_replicas_behind_one_target_share_the_work(pair):
    a, b = pair
    before = (metric(a.server, "rmscore_sequences_scored_total"), metric(b, "rmscore_sequences_scored_total"))
    seqs, want = rollout_with_reference(320, 4, 10, seed=6)
    with RewardClient(f"ipv4:{a.target},{b.target}", chunk_size=16, max_concurrency=2) as rm:
        rm.info()  # connects the channel
        r = rm.score_ids(seqs)
    assert_scores(r.scores, want)
    got_a = metric(a.server, "rmscore_sequences_scored_total") - before[0]
    got_b = metric(b, "rmscore_sequences_scored_total") - before[1]
    assert got_a > 0 and got_b > 0, (got_a, got_b)
    assert got_a + got_b >= len(seqs)


def test_replica_killed_mid_run_and_restarted_loses_no_score(pair):
    """SIGKILL replica a while a chunked rollout (round_robin over a and b) and a stream (pinned
    to a by pick_first) are in flight on it; then start a again on the same port."""
    a, b = pair
    seqs, want = rollout_with_reference(640, 6, 12, seed=7)
    sseqs, swant = rollout_with_reference(240, 4, 8, seed=17)
    chunks_done, items_done = threading.Event(), threading.Event()
    count = [0]

    def on_chunk(_):
        count[0] += 1
        if count[0] >= 3:
            chunks_done.set()

    target = f"ipv4:{a.target},{b.target}"
    retry = RetryPolicy(max_attempts=10, initial_backoff_s=0.05, max_backoff_s=1.0)
    results: dict = {}
    streamed: list = []
    # The stream's client connects first, on its own subchannels, so pick_first settles on a.
    with RewardClient(target, load_balancing="pick_first", chunk_size=4, max_concurrency=2, retry=retry,
                      channel_options=PRIVATE_SUBCHANNELS) as rs, \
            RewardClient(target, chunk_size=16, max_concurrency=4, timeout_s=120, retry=retry) as rm:
        rs.info()
        rm.info()

        def run():
            try:
                results["r"] = rm.score_ids(seqs, on_chunk=on_chunk)
            except BaseException as e:  # noqa: BLE001 - reported below
                results["e"] = e

        def run_stream():
            try:
                for i, score in rs.stream(enumerate(sseqs)):
                    streamed.append((i, score))
                    if len(streamed) >= 16:
                        items_done.set()
            except BaseException as e:  # noqa: BLE001 - reported below
                results["stream_error"] = e
            items_done.set()

        threads = [threading.Thread(target=run), threading.Thread(target=run_stream)]
        for t in threads:
            t.start()
        assert chunks_done.wait(120) and items_done.wait(120)
        assert len(streamed) < len(sseqs) and "r" not in results, "finished before the kill: nothing tested"
        a.kill()  # SIGKILL with chunks and stream items in flight on it
        for t in threads:
            t.join(180)
            assert not t.is_alive()
        assert "e" not in results and "stream_error" not in results, results
        r = results["r"]
        assert_scores(r.scores, want)  # every position scored exactly once, in order
        assert len(r.timings) == len(seqs) // 16
        assert sum(t.attempts - 1 for t in r.timings) >= 1  # the kill did cut chunks short: they were re-sent
        assert sorted(i for i, _ in streamed) == list(range(len(sseqs)))  # each id exactly once
        assert_scores([s for _, s in sorted(streamed)], swant)
        assert rs.stream_restarts >= 1  # the stream did break and was reopened on b

        a.start()  # again, on the same port
        assert a.server.port == int(a.target.rsplit(":", 1)[1])
        seqs2, want2 = rollout_with_reference(160, 4, 8, seed=8)
        deadline = time.monotonic() + 60
        while True:  # the channel reconnects to the restarted replica by itself
            r2 = rm.score_ids(seqs2)
            assert_scores(r2.scores, want2)
            if metric(a.server, "rmscore_sequences_scored_total") > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert metric(a.server, "rmscore_sequences_scored_total") > 0


def test_unreachable_target_is_unavailable_after_retries(pair):
    with RewardClient(f"127.0.0.1:{free_port()}", timeout_s=10,
                      retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)) as rm:
        with pytest.raises(Unavailable) as e:
            rm.score_ids([[101, 102]])
    assert e.value.code == "UNAVAILABLE" and e.value.attempts == 3


def test_stream_yields_each_id_once_with_its_score(pair):
    _, b = pair
    seqs, want = rollout_with_reference(120, 4, 12, seed=9)

    def finished_rollouts():  # as a trainer would: one by one, some text, ids of any type
        for i, s in enumerate(seqs):
            if i % 40 == 0:
                time.sleep(0.05)
            yield (("r", i), s)

    with RewardClient(b.target, chunk_size=8, max_concurrency=2) as rm:  # at most 16 in flight
        got = dict(rm.stream(finished_rollouts()))
        assert sorted(got) == [("r", i) for i in range(len(seqs))]
        assert_scores([got[("r", i)] for i in range(len(seqs))], want)

        items = [(0, [101, 2000, 102]), (1, [101, 40000, 102]), (2, ("why?", "because."))]
        out = dict(rm.stream(items, errors="yield"))
        assert isinstance(out[1], InvalidInput) and "sequence.tokens.ids[1]" in out[1].message
        assert out[1].item_id == 1
        ids2 = local_tokenizer().encode("why?", "because.").ids
        assert_scores([out[0], out[2]], ort_scores([[101, 2000, 102], ids2]))
        with pytest.raises(InvalidInput) as e:
            list(rm.stream(items))
        assert e.value.item_id == 1
        assert list(rm.stream([])) == []


def test_async_client_scores_and_streams(pair):
    _, b = pair
    seqs, want = rollout_with_reference(200, 4, 12, seed=10)

    async def main():
        async with AsyncRewardClient(b.target, chunk_size=25, max_concurrency=4) as rm:
            r1, r2 = await asyncio.gather(rm.score_ids(seqs[:100]), rm.score_ids(seqs[100:]))

            async def items():
                for i, s in enumerate(seqs):
                    yield i, s
                    if i % 50 == 0:
                        await asyncio.sleep(0.01)

            streamed = {i: s async for i, s in rm.stream(items())}
            with pytest.raises(InvalidInput):
                await rm.score_ids([[101, -1, 102]])
            return r1.scores + r2.scores, [streamed[i] for i in range(len(seqs))]

    batch, streamed = asyncio.run(main())
    assert_scores(batch, want)
    assert_scores(streamed, want)


def test_options_are_checked():
    with pytest.raises(ValueError):
        RewardClient("127.0.0.1:1", chunk_size=0)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RewardClient("127.0.0.1:1", truncation="middle")


# ---- HTTP --------------------------------------------------------------------------------------
def test_http_client_same_interface(http_server):
    seqs, want = rollout_with_reference(300, 4, 12, seed=11)
    prompts, responses = texts(20, seed=12)
    with HttpRewardClient(http_server.base_url, chunk_size=32, max_concurrency=4) as rm:
        r = rm.score_ids(seqs)
        assert_scores(r.scores, want)
        assert len(r.timings) == 10 and r.model_version == MANIFEST["version"]
        ids = [e.ids for e in local_tokenizer().encode_batch(list(zip(prompts, responses)))]
        assert rm.tokenize(prompts, responses) == ids
        assert rm.score_texts(prompts, responses).scores == rm.score_ids(ids).scores
        info = rm.info()
        assert (info.version, info.server) == (MANIFEST["version"], "py-http")
        assert rm.health().serving
        got = dict(rm.stream([(i, s) for i, s in enumerate(seqs[:50])] + [("bad", [101, 40000])], errors="yield"))
        assert_scores([got[i] for i in range(50)], want[:50])
        assert isinstance(got["bad"], InvalidInput)


def test_http_errors_are_typed_and_invalid_sent_once(http_server):
    before = metric(http_server, "rmscore_requests_total", code="INVALID_ARGUMENT")
    with HttpRewardClient(http_server.base_url, retry=RetryPolicy(max_attempts=5, initial_backoff_s=0.01)) as rm:
        with pytest.raises(InvalidInput) as e:
            rm.score_ids([[101, 40000, 102]])
        assert "sequences[0].tokens.ids[1]" in e.value.message and e.value.attempts == 1
        assert metric(http_server, "rmscore_requests_total", code="INVALID_ARGUMENT") - before == 1
        with pytest.raises(DeadlineExceeded):
            rm.score_ids(rollout(256, 48, 64, seed=13), timeout_s=0.001)
    with HttpRewardClient(f"http://127.0.0.1:{free_port()}",
                          retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as rm:
        with pytest.raises(Unavailable) as e:
            rm.score_ids([[101, 102]])
        assert e.value.attempts == 2
        assert not rm.health().serving


def test_http_async_client(http_server):
    seqs, want = rollout_with_reference(100, 4, 12, seed=14)

    async def main():
        async with AsyncHttpRewardClient(http_server.base_url, chunk_size=10) as rm:
            return (await rm.score_ids(seqs)).scores

    assert_scores(asyncio.run(main()), want)



def test_dns_target(pair):
    """A DNS name (here localhost: 127.0.0.1, and ::1 where nothing listens) through round_robin."""
    _, b = pair
    seqs, want = rollout_with_reference(40, 4, 8, seed=19)
    with RewardClient(f"dns:///localhost:{b.port}", chunk_size=8) as rm:
        assert_scores(rm.score_ids(seqs).scores, want)


def test_stream_moves_off_a_draining_replica(pair):
    """SIGTERM replica a while a stream (pinned to a by pick_first) is in flight: a drains and
    refuses new items as UNAVAILABLE, then goes; the stream is reopened on b, nothing lost.
    Leaves a stopped (`pair` starts it again for any test after this one)."""
    a, b = pair
    seqs, want = rollout_with_reference(240, 4, 8, seed=18)
    progressed = threading.Event()
    streamed: list = []
    errors: list = []
    retry = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.5)
    with RewardClient(f"ipv4:{a.target},{b.target}", load_balancing="pick_first", chunk_size=4,
                      max_concurrency=2, retry=retry, channel_options=PRIVATE_SUBCHANNELS) as rs:
        rs.info()

        def run():
            try:
                for i, score in rs.stream(enumerate(seqs)):
                    streamed.append((i, score))
                    if len(streamed) >= 16:
                        progressed.set()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
            progressed.set()

        t = threading.Thread(target=run)
        t.start()
        assert progressed.wait(120)
        assert len(streamed) < len(seqs) and not errors, "finished before SIGTERM: nothing tested"
        a.server.signal(signal.SIGTERM)
        t.join(180)
        assert not t.is_alive() and not errors, errors
        assert a.server.proc.wait(60) == 0
    assert sorted(i for i, _ in streamed) == list(range(len(seqs)))
    assert_scores([s for _, s in sorted(streamed)], want)
    assert rs.stream_restarts >= 1
