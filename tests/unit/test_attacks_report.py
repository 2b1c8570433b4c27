"""The attack run's report (tools/rmscore_tools/reliability/attacks.py), without servers: probe figures
from the prober's results, the table row, and the goal's verdict (issue 29)."""

from rmscore_tools.reliability import attacks


def _row(**over):
    probes = [["OK", 12.0, ""], ["OK", 30.0, ""], ["RESOURCE_EXHAUSTED", 150.0, "queue full"],
              ["DEADLINE_EXCEEDED", 2001.0, "deadline"], ["UNAVAILABLE", 3.0, "x"]]
    r = {"kind": "py-grpc-onnxruntime", "attack": "big_1024x512", "family": "4", "load_start": "1.50 1.2 1.0",
         "baseline_mib": 1000.0, "peak_over_mib": 250.0, "after_mib": 1050.0, "alive": True,
         "calls": {"sent": 10, "OK": 6, "RESOURCE_EXHAUSTED": 3, "LOST:UNAVAILABLE": 1}, "lost": 1,
         **attacks.probe_figures(probes)}
    r.update(over)
    return r


def test_probe_figures_split_served_refused_and_timed_out():
    f = attacks.probe_figures([["OK", 12.0, ""], ["OK", 30.0, ""], ["RESOURCE_EXHAUSTED", 150.0, "q"],
                               ["DEADLINE_EXCEEDED", 2001.0, "d"], ["UNAVAILABLE", 3.0, "x"]])
    assert (f["probes"], f["served"], f["refused"], f["timed_out"], f["slow_refusals"]) == (5, 2, 2, 1, 1)
    assert f["p50_ms"] == 30.0 and f["max_ms"] == 2001.0
    assert f["refusal_codes"] == {"RESOURCE_EXHAUSTED": 1, "UNAVAILABLE": 1}
    assert attacks.probe_figures([])["p99_ms"] is None


def test_row_has_every_column_and_the_figures():
    line = attacks.format_row(_row())
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == len(attacks.COLUMNS)
    assert cells[:4] == ["py-grpc-onnxruntime", "big_1024x512", "1.50", "2/2/1"]
    assert cells[8:] == ["1000", "250", "1050 (+5.0%)", "yes", "10/6/3", "-", "1"]
    timed = attacks.format_row(_row(call_refusals=attacks.refusal_figures([4.0, 6.0, 250.0])))
    assert [c.strip() for c in timed.strip("|").split("|")][13] == "6.0/250.0 (1)"
    table = attacks.table([_row(), {"kind": "cpp-grpc", "attack": "burst_300", "family": "6", "skipped": "server dead"}])
    lines = table.splitlines()
    assert len(lines) == 4 and all(len(x.strip("|").split("|")) == len(attacks.COLUMNS) for x in lines[2:])


def test_the_attacks_own_refusals_are_timed_and_nothing_else():
    # Only a refusal's time is kept: a scored call, a lost one or one the client gave up on is not a
    # refusal, and a refusal of 100 ms or more is counted slow, as a probe's is.
    t = attacks._Tally()
    for outcome, ms in [("OK", 900.0), ("LOST:UNAVAILABLE", 5.0), ("ABANDONED:no-deadline", 30000.0),
                        ("RESOURCE_EXHAUSTED", 3.0), ("HTTP_429", 120.0), ("DEADLINE_EXCEEDED", 7.0)]:
        t.add(outcome, ms=ms)
    t.add("UNAVAILABLE", n=5)  # stream items, untimed
    assert t.c["sent"] == 11 and t.refusal_ms == [3.0, 120.0, 7.0]
    f = attacks.refusal_figures(t.refusal_ms)
    assert (f["n"], f["p50_ms"], f["max_ms"], f["slow"]) == (3, 7.0, 120.0, 1)
    assert attacks.refusal_figures([]) == {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "slow": 0}


def test_verdict_follows_the_goal():
    v = attacks.verdict(_row())
    assert v == {"probes": False, "peak": True, "after": True, "alive": True, "lost": False}
    good = _row(timed_out=0, slow_refusals=0, lost=0, peak_over_mib=1124.0, after_mib=1099.0)
    assert all(attacks.verdict(good).values())
    assert not attacks.verdict(_row(peak_over_mib=1125.0))["peak"]  # over 10% of baseline + 1 GiB budget
    assert not attacks.verdict(_row(after_mib=1101.0))["after"]
    assert not attacks.verdict(_row(after_mib=None, alive=False))["alive"]


def test_every_attack_is_bounded_and_named_for_its_kinds():
    for name, (fn, family, only) in attacks.ATTACKS.items():
        assert callable(fn) and family and fn.__doc__
        assert only is None or set(only) <= {"grpc", "http", "py"}
    assert attacks.applies("trunc_stream", "cpp-grpc") and not attacks.applies("trunc_stream", "py-http-onnxruntime")
    assert attacks.applies("text_cap_8x130k", "py-grpc-onnxruntime") and not attacks.applies("text_cap_8x130k", "cpp-grpc")


def test_a_client_timeout_is_lost_only_when_the_body_set_a_deadline():
    # A server that accepts and never answers: the client's timeout is "lost" when the body carried
    # timeout_ms (an answer was owed before it), "abandoned" when it set no deadline (vLLM's /score).
    import socket

    import httpx

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with httpx.Client(base_url=f"http://127.0.0.1:{srv.getsockname()[1]}", timeout=0.2) as client:
            assert attacks._http_outcome(client, "/score", b'{"text_1": "q", "text_2": ["d"]}') == "ABANDONED:no-deadline"
            assert attacks._http_outcome(client, "/rmscore/v1/score", b'{"timeout_ms": 100}') == "LOST:TIMEOUT"
