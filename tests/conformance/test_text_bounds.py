"""Text bounds on every Python kind (issue 29, defect 3; docs/contract.md, "Input bounds"): a text
longer than --max-text-chars is refused INVALID_ARGUMENT before it is tokenized, fast, while probes
from other connections stay answered. The C++ server takes token ids only.

Before: one 15 MiB text on /get_reward took 8 to 25 s of tokenizing with the GIL held, and the
probes sent meanwhile timed out; on gRPC it was tokenized whole before its length was refused."""

from __future__ import annotations

import json
import threading
import time

import grpc
import httpx
import pytest

import servers
from rmscore_tools import kinds
from rmscore_tools.observe import cpu_s

KINDS = [k for k in servers.frontend_kinds() if kinds.get(k).language == "python"]
HUGE = "word " * (3 * (1 << 20))  # 15 MiB of text
# Probes: a good one-sequence request on a fresh connection, 2 s deadline, as issue 29 measured them.
# Looser than the 100 ms goal on a shared 2-core test machine; before, they waited seconds.
PROBE_BOUND_S = 1.0
REFUSED_WITHIN_S = 5.0


@pytest.fixture(scope="module", params=KINDS)
def server(request):
    s = servers.start(request.param)
    yield s
    s.stop()


class Probes:
    """Good requests on fresh connections from a thread, one after another, until stopped."""

    def __init__(self, server):
        self.server, self.latencies, self.failures = server, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def one(self) -> None:
        if self.server.transport == "http":
            r = httpx.post(self.server.base_url + "/rmscore/v1/score", timeout=2,
                           json={"sequences": [{"tokens": [101, 2054, 102]}], "timeout_ms": 2000})
            assert r.status_code == 200, r.text
        else:
            from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

            with grpc.insecure_channel(self.server.target) as ch:
                reward_pb2_grpc.RewardModelStub(ch).Score(reward_pb2.ScoreRequest(sequences=[reward_pb2.Sequence(
                    tokens=reward_pb2.TokenIds(ids=[101, 2054, 102]))]), timeout=2)

    def loop(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            try:
                self.one()
            except Exception as e:  # noqa: BLE001 - counted, reported by the test
                self.failures.append(repr(e)[:200])
            self.latencies.append(time.perf_counter() - t)
            time.sleep(0.02)

    def __enter__(self):
        self.one()  # the first connection's setup is not the server's answer time
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def refused(server, attempt) -> tuple[float, str]:
    """`attempt()` -> (error code name, message) on its own connection, timed, with probes running."""
    with Probes(server) as probes:
        time.sleep(0.1)
        t = time.perf_counter()
        code, message = attempt()
        elapsed = time.perf_counter() - t
        time.sleep(0.2)
    assert not probes.failures, probes.failures
    assert probes.latencies and max(probes.latencies) < PROBE_BOUND_S, sorted(probes.latencies)[-5:]
    assert code == "INVALID_ARGUMENT" and "max_text_chars" in message, (code, message[:300])
    assert elapsed < REFUSED_WITHIN_S, elapsed
    return elapsed, message


def http_post(server, path: str, body: dict) -> tuple[str, str]:
    r = httpx.post(server.base_url + path, content=json.dumps(body).encode(), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    return r.json()["error"]["code"], r.json()["error"]["message"]


def test_huge_text_on_get_reward_is_refused_fast(server):
    if server.transport != "http":
        pytest.skip("/get_reward is the HTTP kind's")
    _, message = refused(server, lambda: http_post(server, "/get_reward", {"query": [HUGE], "prompts": ["word"]}))
    assert message.startswith(f"query[0]: {len(HUGE)} characters exceed max_text_chars 131072"), message


def test_huge_text_on_score_is_refused_fast(server):
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    if server.transport == "http":
        _, message = refused(server, lambda: http_post(server, "/rmscore/v1/score", {
            "sequences": [{"prompt": HUGE, "response": "x"}], "truncation": "left"}))
    else:
        def unary():
            with grpc.insecure_channel(server.target) as ch:
                try:
                    reward_pb2_grpc.RewardModelStub(ch).Score(reward_pb2.ScoreRequest(
                        sequences=[reward_pb2.Sequence(text=reward_pb2.TextPair(prompt=HUGE, response="x"))],
                        truncation=reward_pb2.TRUNCATION_LEFT), timeout=60)
                except grpc.RpcError as e:
                    return e.code().name, e.details()
            return "OK", ""
        _, message = refused(server, unary)
    assert message.startswith(f"sequences[0].text.prompt: {len(HUGE)} characters exceed max_text_chars"), message


def test_huge_text_in_a_stream_is_refused_fast(server):
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    if server.transport != "grpc":
        pytest.skip("ScoreStream is the gRPC kinds'")

    def stream():
        with grpc.insecure_channel(server.target) as ch:
            item = reward_pb2.ScoreStreamRequest(id="7", truncation=reward_pb2.TRUNCATION_LEFT, sequence=reward_pb2.Sequence(
                text=reward_pb2.TextPair(prompt="why?", response=HUGE)))
            (answer,) = list(reward_pb2_grpc.RewardModelStub(ch).ScoreStream(iter([item]), timeout=60))
        assert answer.id == "7" and answer.WhichOneof("result") == "error", answer
        return grpc.StatusCode.INVALID_ARGUMENT.name if answer.error.code == 3 else str(answer.error.code), \
            answer.error.message
    _, message = refused(server, stream)
    assert message.startswith(f"sequence.text.response: {len(HUGE)} characters exceed max_text_chars"), message


def test_tokenizing_stops_when_the_caller_goes(server):
    """Texts under the cap but many of them (about 6 s of tokenizing here); the client goes after
    0.5 s. The server stops between pieces: little CPU after that. Before, it tokenized on for seconds."""
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    text = "hello world " * 10_000  # 120,000 characters: under the default cap
    n = 100
    if server.transport == "http":
        body = json.dumps({"query": [text + str(i) for i in range(n)]}).encode()

        def send():
            try:
                httpx.post(server.base_url + "/get_reward", content=body, timeout=0.5,
                           headers={"content-type": "application/json"})
            except httpx.TimeoutException:
                pass  # the client gives up: httpx closes the connection
    else:
        request = reward_pb2.ScoreRequest(truncation=reward_pb2.TRUNCATION_LEFT, sequences=[
            reward_pb2.Sequence(text=reward_pb2.TextPair(prompt=text + str(i), response="ok")) for i in range(n)])

        def send():
            with grpc.insecure_channel(server.target) as ch:
                try:
                    reward_pb2_grpc.RewardModelStub(ch).Score(request, timeout=0.5)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    send()
    time.sleep(0.5)  # the piece running when the caller went may finish
    before = cpu_s(server.proc.pid)
    time.sleep(1.5)
    spent = cpu_s(server.proc.pid) - before
    assert spent < 0.4, f"{spent:.2f} CPU-s spent after the caller went"
    # And the server still answers text at once.
    with Probes(server) as probes:
        pass
    assert not probes.failures, probes.failures


@pytest.fixture(scope="module", params=KINDS)
def tight(request):
    """A server whose work bound is 1 s, so that a few seconds of tokenizing ahead is over it, and
    whose texts may be long, so that those seconds are a few texts, not a long model run after."""
    s = servers.start(request.param, max_queue_wait_seconds=1, max_text_chars=4_000_000)
    yield s
    s.stop()


def test_tokenizing_ahead_is_counted_by_admission(tight):
    """While one caller's texts (about 4 s of tokenizing here) are tokenized, another text request is
    refused RESOURCE_EXHAUSTED at once for the tokenizing ahead; before, admission saw none of it."""
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc

    texts = ["hello world " * 200_000 + str(i) for i in range(3)]  # 7.2 M characters

    def score(prompts: list[str], timeout: float) -> tuple[str, str]:
        if tight.transport == "http":
            r = httpx.post(tight.base_url + "/rmscore/v1/score", timeout=timeout, json={
                "truncation": "left", "sequences": [{"prompt": p, "response": "ok"} for p in prompts]})
            return ("OK", "") if r.status_code == 200 else (r.json()["error"]["code"], r.json()["error"]["message"])
        with grpc.insecure_channel(tight.target) as ch:
            try:
                reward_pb2_grpc.RewardModelStub(ch).Score(reward_pb2.ScoreRequest(
                    truncation=reward_pb2.TRUNCATION_LEFT, sequences=[reward_pb2.Sequence(
                        text=reward_pb2.TextPair(prompt=p, response="ok")) for p in prompts]), timeout=timeout)
            except grpc.RpcError as e:
                return e.code().name, e.details()
        return "OK", ""

    big = threading.Thread(target=lambda: score(texts, 30), daemon=True)
    big.start()
    # Small text requests while it runs: the first sent after its body is in and its tokenizing is
    # counted is refused (how soon that is depends on the transport and the machine).
    answers = []
    while big.is_alive() and not any(code != "OK" for code, _, _ in answers):
        time.sleep(0.1)
        t = time.perf_counter()
        answers.append((*score(["why?"], 10), time.perf_counter() - t))
    big.join(30)
    refused = [a for a in answers if a[0] != "OK"]
    assert refused, answers
    code, message, elapsed = refused[0]
    assert code == "RESOURCE_EXHAUSTED" and "of tokenizing waiting exceeds max_queue_wait_seconds" in message, \
        (code, message)
    assert elapsed < 1.0, elapsed
    assert score(["why?"], 10) == ("OK", "")  # once it is done, text is taken again
