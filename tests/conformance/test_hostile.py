"""The hostile-input corpus (rmscore_tools.reliability.hostile) against every server kind but
py-grpc-compile (servers.frontend_kinds: its frontend is eager's), one server per kind.

Each case is its own test: the bad request gets the contract's code and
message, in time, and the good request sent right after it still gets the
golden scores. After each kind's corpus, the server must still answer health
and a good request, its process must not have exited, and its log must show no
traceback. RMSCORE_TEST_KINDS narrows the kinds.
"""

from __future__ import annotations

import pytest

import servers
from rmscore_tools.reliability import hostile
KINDS = servers.frontend_kinds()
# A small message limit keeps the oversized cases cheap; the count limit is the conformance suite's.
FLAGS = dict(max_sequences_per_request=128, max_request_bytes=4 << 20)
SURVIVED = "server survived the corpus"
# Kind-major order, so each kind's server starts once and stops before the next one starts.
PAIRS = [(kind, name) for kind in KINDS
         for name in hostile.case_names(servers.launch.transport(kind)) + [SURVIVED]]


# Cases a kind still fails, with the fix it needs; strict, so a fixed case turns the run red until
# its entry goes. Empty: every kind passes the whole corpus.
KNOWN: dict[tuple[str, str], str] = {}


class OneServer:
    """At most one server at a time: asking for another kind stops the current one."""

    def __init__(self):
        self.current = None

    def get(self, kind: str):
        if self.current is None or self.current.kind != kind:
            self.stop()
            self.current = servers.start(kind, **FLAGS)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="module")
def pool():
    p = OneServer()
    yield p
    p.stop()


def run(server, names, check_alive=False) -> dict:
    return hostile.run_corpus(server.kind, "127.0.0.1", server.port, server.transport,
                              max_request_bytes=FLAGS["max_request_bytes"], names=names, check_alive=check_alive)


@pytest.mark.parametrize("kind,case", PAIRS, ids=[f"{k}-{n}" for k, n in PAIRS])
def test_hostile(pool, kind, case, request):
    server = pool.get(kind)
    if (kind, case) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[kind, case], strict=True))
    if case == SURVIVED:
        report = run(server, names=[], check_alive=True)
        assert report["server_alive"], server.log()[-3000:]
        assert server.proc.poll() is None, server.log()[-3000:]
        assert "Traceback" not in server.log(), server.log()[-3000:]
        # Bad input is answered, not logged: a log line per bad request lets a client fill the disk.
        assert "invalid UTF-8" not in server.log(), server.log()[-3000:]
        return
    report = run(server, [case])
    assert report["inputs_tried"] == 1
    assert report["unexpected"] == [], report["unexpected"]
    assert report["good_between_correct"] == 1, report["results"][0]["good_after"]
    assert server.proc.poll() is None, server.log()[-3000:]
