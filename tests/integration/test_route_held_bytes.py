"""The bytes budget on the routes that tokenize for themselves (OpenRLHF's /get_reward, vLLM's /classify):
a request is counted as sent, a byte per text character and 8 per token id before any cut, from before
its tokenizing until it is answered (docs/contract.md, --max-queued-request-bytes), as on
/rmscore/v1/score. Before, they were counted after tokenizing as the ids kept: eight 100,000-character
queries held 800 KB and counted 32 KiB, and a request refused for bytes had cost its tokenizing first.

RMSCORE_FAULT_HANG_BATCH stalls the first batch, so the first request stays held while the gauge is read
and the next is refused."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

import servers
from rmscore_tools.observe import metric
from test_client import HTTP_KIND

BUDGET = 1 << 20
HANG_S = 8
QUERY_CHARS = 100_000


@pytest.fixture(scope="module")
def server():
    s = servers.start(HTTP_KIND, max_queued_request_bytes=BUDGET, env={"RMSCORE_FAULT_HANG_BATCH": f"1:{HANG_S}"})
    yield s
    s.stop()


def text(k: int, n: int) -> str:
    return (f"rollout {k} says " + "the sky is blue because air scatters short waves " * (n // 40))[:n]


def test_get_reward_holds_its_characters_from_before_tokenizing_until_answered(server):
    queries = [text(k, QUERY_CHARS) for k in range(8)]
    held = sum(map(len, queries))
    answers = {}

    def hold():  # the first batch hangs: this request stays held
        answers["first"] = httpx.post(server.base_url + "/get_reward", json={"query": queries}, timeout=HANG_S + 60)
    t = threading.Thread(target=hold)
    t.start()
    deadline = time.monotonic() + HANG_S
    while metric(server, "rmscore_queued_request_bytes") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(server, "rmscore_queued_request_bytes") == held  # as sent, not the 8 x 512 ids kept

    # A second caller past the budget is refused at once, before its text is tokenized; so is a vLLM
    # route's, whose ids count 8 bytes each however truncate_prompt_tokens cuts them.
    more = text(99, 300_000 // 3)
    t0 = time.perf_counter()
    r = httpx.post(server.base_url + "/get_reward", json={"query": [more] * 3}, timeout=30)
    assert r.status_code == 429, r.text[:300]
    assert time.perf_counter() - t0 < 1.0
    assert f"{held} bytes of accepted requests held, plus this request's {3 * len(more)}" in r.text, r.text[:300]
    ids = [2000 + i % 500 for i in range(32768)]
    r = httpx.post(server.base_url + "/classify", json={"input": [ids], "truncate_prompt_tokens": 8}, timeout=30)
    assert r.status_code == 429 and f"plus this request's {8 * len(ids)}," in r.text, r.text[:300]

    t.join(HANG_S + 60)
    assert answers["first"].status_code == 200 and len(answers["first"].json()["rewards"]) == 8
    deadline = time.monotonic() + 5
    while metric(server, "rmscore_queued_request_bytes") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "rmscore_queued_request_bytes") == 0
