"""rmscore_tokenize_queue_characters, the gauge of work waiting to be tokenized (issue 29), read from
another process as Prometheus reads it: while a request's text is being tokenized the gauge shows its
characters, and it returns to 0 once the request is answered. The C++ server takes token ids only: it
exports the name at 0 and a text changes nothing (the metric-names conformance test holds the name
on every kind).

One kind per frontend: the tokenizing pool is the Python core's, whatever the runtime behind it.
"""

from __future__ import annotations

import random
import re
import threading
import time

import pytest

import servers
from harness import Caller, CallError

NAME = "rmscore_tokenize_queue_characters"
WORDS = "reward model scores the response to a prompt with care and speed across every kind".split()
SEQUENCES, SIDE_CHARS = 24, 60_000  # each text under the default --max-text-chars (131072)


def kinds() -> list[str]:
    chosen = servers.grpc_kind_per_language()
    return chosen + [k for k in servers.available_kinds() if k.startswith("py-http")][:1]


@pytest.fixture(scope="module", params=kinds())
def server(request):
    s = servers.start(request.param)
    yield s
    s.stop()


def gauge(server) -> float:
    found = re.search(rf"^{NAME}{{[^}}]*}} ([0-9.e+]+)$", server.metrics_text(), re.M)
    assert found, f"{NAME} missing from /metrics"
    return float(found.group(1))


def text(rng: random.Random) -> str:
    out, n = [], 0
    while n < SIDE_CHARS:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:SIDE_CHARS]


def test_the_gauge_shows_text_waiting_to_be_tokenized(server):
    assert gauge(server) == 0
    rng = random.Random(29)
    seqs = [{"prompt": text(rng), "response": text(rng)} for _ in range(SEQUENCES)]
    outcome = {}

    def call():
        try:
            outcome["scores"] = Caller(server).score(seqs, truncation="right", timeout_s=120)
        except CallError as e:
            outcome["error"] = e

    t = threading.Thread(target=call)
    t.start()
    seen, t0 = [], time.monotonic()
    while t.is_alive() and time.monotonic() - t0 < 120:
        seen.append(gauge(server))
        time.sleep(0.005)
    t.join()
    if server.kind == "cpp-grpc":
        assert "error" in outcome and outcome["error"].code == "INVALID_ARGUMENT", outcome
        assert max(seen, default=0) == 0 and gauge(server) == 0
        return
    assert len(outcome.get("scores", [])) == SEQUENCES, outcome
    print(f"{server.kind}: gauge up to {max(seen):.0f} of {2 * SEQUENCES * SIDE_CHARS} characters, "
          f"{sum(v > 0 for v in seen)} of {len(seen)} scrapes above 0")
    assert max(seen) > 0, f"the gauge never showed the {2 * SEQUENCES * SIDE_CHARS} characters ({len(seen)} scrapes)"
    assert max(seen) <= 2 * SEQUENCES * SIDE_CHARS, max(seen)
    assert gauge(server) == 0
