"""Issue 29's attacks, and variants, against each kind with its defaults, judged by the issue's goal:
`python -m rmscore_tools.reliability.attacks --kinds cpp-grpc py-grpc py-http [--seconds 10] [--doc PATH]`.

For each kind a server starts with its defaults (launch.start) on 127.0.0.1. For each attack:
  - baseline RSS (VmRSS of the server process) is read just before it;
  - the attack runs in a process of its own (spawned), for `--seconds` of sending, bounded in count
    (threads, connections, calls); calls still open when the sending stops get their own deadline to end;
  - a prober process (rmscore_tools.reliability.prober) sends a good one-sequence Score on a fresh
    connection with a 2 s deadline every 0.2 s throughout;
  - RSS is sampled every 0.1 s (peak over baseline), and again `--settle` seconds after the attack ends;
  - alive: the server process has not exited, and it answers a probe afterwards.

Figures per row: probes served / refused / timed out (a probe taking >= 1.9 s is timed out whatever its
code), refusals slower than 100 ms, probe p50 / p99 / max, peak RSS over baseline, RSS after vs baseline,
alive, and the attack's own calls: sent, answered (OK), refused (by code; those sent one by one also timed
from send to answer: p50 / p99 ms and how many took 100 ms or more), lost. "Lost" is a call or a
stream item that got no answer from the server: a transport error (connection closed or reset with no
status, HTTP read error), a stream item missing from its stream's answers, or an HTTP client timeout (the
body carries timeout_ms, so the server owes an answer before it; one without it that the client gave up on
counts as ABANDONED:no-deadline, not lost). gRPC DEADLINE_EXCEEDED cannot be told
from the client's own deadline and counts as refused.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from rmscore_tools import launch

ROOT = launch.ROOT
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 2.0
FAST_MS = 100.0
CALL_DEADLINE_S = 20.0  # the attack's own calls: the server must answer within this


# ---- measuring ----------------------------------------------------------------------------------

def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def probe_figures(results: list) -> dict:
    """results: the prober's [code, ms, detail] list."""
    ms = [r[1] for r in results]
    timed_out = [r for r in results if r[1] >= PROBE_TIMEOUT_S * 1000 * 0.95]
    served = [r for r in results if r[0] == "OK" and r not in timed_out]
    refused = [r for r in results if r[0] != "OK" and r not in timed_out]
    return {"probes": len(results), "served": len(served), "refused": len(refused), "timed_out": len(timed_out),
            "slow_refusals": sum(1 for r in refused if r[1] >= FAST_MS),
            "served_over_deadline": 0,
            "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99), "max_ms": max(ms) if ms else None,
            "refusal_codes": dict(Counter(r[0] for r in refused)),
            "refusal_sample": next((r[2] for r in refused), "")}


# ---- attack helpers (run in the attacker process) -----------------------------------------------

def _ids(n: int, k: int = 0) -> list[int]:
    return [101] + [1000 + (i * 7 + k) % 20000 for i in range(max(0, n - 2))] + [102]


def _pb():
    from rmscore_client.v1 import reward_pb2, reward_pb2_grpc
    return reward_pb2, reward_pb2_grpc


def _grpc_channel(target: str, own_connection: bool = True):
    import grpc
    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    if own_connection:
        opts.append(("grpc.use_local_subchannel_pool", 1))
    return grpc.insecure_channel(target, options=opts)


def _grpc_outcome(fn) -> str:
    import grpc
    try:
        fn()
        return "OK"
    except grpc.RpcError as e:
        code = e.code().name
        d = (e.details() or "").lower()
        if code in ("UNAVAILABLE", "UNKNOWN", "INTERNAL", "CANCELLED") and any(
                w in d for w in ("socket closed", "connection reset", "goaway", "broken pipe", "stream removed",
                                 "connection refused", "failed to connect", "eof", "rst_stream", "refused_stream")):
            return "LOST:" + code
        return code


def _http_outcome(client, path: str, body: bytes) -> str:
    import httpx
    try:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    except httpx.TimeoutException:
        # Lost only when the server owed an answer before the client gave up (the module docstring):
        # a body with no timeout_ms (vLLM's /score, /rerank) sets no deadline, and the server may
        # still be feeding it in parts behind other callers (docs/contract.md, "Shares per caller").
        return "LOST:TIMEOUT" if b'"timeout_ms"' in body else "ABANDONED:no-deadline"
    except httpx.HTTPError as e:
        return "LOST:" + type(e).__name__
    return "OK" if r.status_code == 200 else f"HTTP_{r.status_code}"


def refused_outcome(outcome: str) -> bool:
    """An answer that is a refusal: not OK, and not a call the server never answered."""
    return outcome != "OK" and not outcome.startswith(("LOST", "ABANDONED"))


def refusal_figures(ms: list[float]) -> dict:
    """The attack's own refused calls, each timed from its send to its answer: how fast overload is
    refused to the attacker itself, not only to the probes beside it."""
    return {"n": len(ms), "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99), "max_ms": max(ms) if ms else None,
            "slow": sum(1 for m in ms if m >= FAST_MS)}


class _Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.c: Counter = Counter()
        self.refusal_ms: list[float] = []

    def add(self, outcome: str, n: int = 1, ms: float | None = None) -> None:
        """`ms`: the call's time from send to answer, kept for a refusal (refusal_figures)."""
        with self.lock:
            self.c["sent"] += n
            self.c[outcome] += n
            if ms is not None and refused_outcome(outcome):
                self.refusal_ms.append(ms)


def _loop(threads: int, until: float, once, tally: _Tally, per_thread_state=None, every_s: float = 0.0) -> None:
    """`threads` threads, each calling once(i, state) until `until`, a call at most every `every_s`
    (0: back to back); the outcomes are tallied."""
    def worker(i):
        st = per_thread_state(i) if per_thread_state else None
        while time.monotonic() < until:
            t = time.monotonic()
            outcome = once(i, st)
            tally.add(outcome, ms=(time.monotonic() - t) * 1000)
            time.sleep(max(0.0, every_s - (time.monotonic() - t)))
    _run_workers(worker, threads, until + CALL_DEADLINE_S + 10)


def _unary_flood(ctx, threads: int, make, own_connections: bool = True, every_s: float = 0.0) -> None:
    """`threads` callers (a connection each), each sending `make(i)` back to back, or one every
    `every_s`. make: a pb request (gRPC) or (path, body bytes) (HTTP)."""
    tally, until = ctx["tally"], ctx["until"]
    if ctx["transport"] == "grpc":
        pb, pbg = _pb()

        def state(i):
            ch = _grpc_channel(ctx["target"], own_connections)
            return pbg.RewardModelStub(ch), make(i)

        def once(i, st):
            stub, req = st
            return _grpc_outcome(lambda: stub.Score(req, timeout=CALL_DEADLINE_S))
    else:
        import httpx

        def state(i):
            return httpx.Client(base_url=ctx["base_url"], timeout=CALL_DEADLINE_S + 5), make(i)

        def once(i, st):
            client, (path, body) = st
            return _http_outcome(client, path, body)
    _loop(threads, until, once, tally, state, every_s)


def _score_body(seqs: list[dict], truncation: str = "none", timeout_ms: int | None = None) -> bytes:
    b = {"sequences": seqs, "truncation": truncation}
    b["timeout_ms"] = timeout_ms or int(CALL_DEADLINE_S * 1000)
    return json.dumps(b).encode()


def _tok_request(seqs: list[list[int]], truncation: int = 0):
    pb, _ = _pb()
    return pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=s)) for s in seqs], truncation=truncation)


def _tokens(ctx, threads: int, seqs_fn, truncation: str) -> None:
    tr = {"none": 0, "left": 1, "right": 2}[truncation]
    if ctx["transport"] == "grpc":
        _unary_flood(ctx, threads, lambda i: _tok_request(seqs_fn(i), tr))
    else:
        _unary_flood(ctx, threads, lambda i: ("/rmscore/v1/score",
                                              _score_body([{"tokens": s} for s in seqs_fn(i)], truncation)))


# ---- the attacks -------------------------------------------------------------------------------
# Each takes ctx (transport, target, base_url, port, until, tally) and returns nothing; bounded by
# `until` and by its own thread / connection counts.


def _run_workers(worker, n: int, end: float) -> None:
    """`worker(i)` for i in range(n), each on a daemon thread; waits for them until `end` (monotonic)."""
    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(end - time.monotonic())

def a_trunc_max(ctx):
    """Defect 1, now: 4 callers send one sequence of 32768 ids (64 x the window, the most accepted)
    with truncation LEFT, back to back."""
    _tokens(ctx, 4, lambda i: [_ids(32768, i)], "left")


def a_trunc_over(ctx):
    """Defect 1 variant: 2 callers send one sequence of 1M ids (over the 64x cap: refused) with truncation."""
    _tokens(ctx, 2, lambda i: [_ids(1 << 20, i)], "left")


def a_trunc_spelled(ctx):
    """Defect 1 variant (HTTP): a 1M-id sequence as trunc_1M_refused sends it, its key spelled so that a
    byte search misses it: caller 0 escapes a letter (`"\\u0074okens"`, the same key to JSON), caller 1
    puts 100 spaces before it. Each must be refused without its million ids decoded (json_body.py)."""
    def make(i):
        body = _score_body([{"tokens": _ids(1 << 20, i)}], "left")
        spelled = b'"\\u0074okens"' if i % 2 == 0 else b" " * 100 + b'"tokens"'
        return "/rmscore/v1/score", body.replace(b'"tokens"', spelled, 1)
    _unary_flood(ctx, 2, make)


def a_long_ints(ctx):
    """Hold a core (HTTP): 2 callers send back to back 15 MiB bodies of integers of 4300 digits (the most
    Python converts by default, in time quadratic in them) where token ids belong."""
    digits = b"7" * 4300
    body = b'{"sequences": [{"tokens": [' + b",".join([digits] * (15 * (1 << 20) // 4301)) + b']}], "truncation": "left"}'
    _unary_flood(ctx, 2, lambda i: ("/rmscore/v1/score", body))


def a_containers(ctx):
    """Hold a core (HTTP): 2 callers send back to back 14 MiB bodies of 5M empty arrays where the
    sequences belong: each is a container the garbage collector tracks while the body decodes."""
    body = b'{"sequences": [' + b"[]," * 5_000_000 + b'[]], "truncation": "left"}'
    _unary_flood(ctx, 2, lambda i: ("/rmscore/v1/score", body))


def a_trunc_wide(ctx):
    """Defect 1 variant: 4 callers send 64 sequences of 32768 ids each (16 MiB of int64 ids held per call)."""
    _tokens(ctx, 4, lambda i: [_ids(32768, i + k) for k in range(16)], "right")


def _streams(ctx, streams: int, item, rate_per_s: float | None, max_items: int, own_connections: bool) -> None:
    """`streams` ScoreStreams (each on its own connection when own_connections), each sending items
    (one item(i, n) every 1/rate s, or as fast as they go) until `until` (at most max_items), then
    closing and reading every answer: a sent id without an answer is lost."""
    pb, pbg = _pb()
    tally, until = ctx["tally"], ctx["until"]
    shared = None if own_connections else _grpc_channel(ctx["target"], False)

    def worker(i):
        ch = shared or _grpc_channel(ctx["target"], True)
        stub = pbg.RewardModelStub(ch)
        sent: list[str] = []

        def gen():
            n = 0
            while time.monotonic() < until and n < max_items:
                sid = f"{i}-{n}"
                sent.append(sid)
                yield item(i, n, sid)
                n += 1
                if rate_per_s:
                    time.sleep(1 / rate_per_s)
        got: dict[str, str] = {}
        outcome = "OK"
        try:
            for r in stub.ScoreStream(gen(), timeout=(until - time.monotonic()) + CALL_DEADLINE_S):
                got[r.id] = "OK" if r.WhichOneof("result") == "score" else f"ITEM_{r.error.code}"
        except Exception as e:  # noqa: BLE001
            outcome = _grpc_outcome(lambda: (_ for _ in ()).throw(e))
        for sid in sent:
            tally.add(got.get(sid, "LOST:" + outcome if outcome != "OK" else "LOST:no-answer"))
    _run_workers(worker, streams, until + CALL_DEADLINE_S + 10)


def a_trunc_stream(ctx):
    """Defect 1, streamed: 8 streams send items of 32768 ids with truncation LEFT as fast as they go."""
    if ctx["transport"] != "grpc":
        return a_trunc_max(ctx)
    pb, _ = _pb()
    _streams(ctx, 8, lambda i, n, sid: pb.ScoreStreamRequest(
        id=sid, sequence=pb.Sequence(tokens=pb.TokenIds(ids=_ids(32768, n))), truncation=1), None, 2000, True)


def a_big_request(ctx):
    """Defect 4: one caller sends a 1024 x 512 request (about 2.6 MB on the wire), back to back."""
    _tokens(ctx, 1, lambda i: [_ids(512, k) for k in range(1024)], "none")


def a_big_bodies(ctx):
    """Defects 4-5 variant: 4 callers (own connections) send 1024 x 512 requests back to back."""
    _tokens(ctx, 4, lambda i: [_ids(512, k + i) for k in range(1024)], "none")


def a_streams_100(ctx):
    """Defect 4: 100 streams on one connection, one 512-token item a second each (HTTP: 100 callers,
    one 512-token request a second each)."""
    if ctx["transport"] == "grpc":
        pb, _ = _pb()
        _streams(ctx, 100, lambda i, n, sid: pb.ScoreStreamRequest(
            id=sid, sequence=pb.Sequence(tokens=pb.TokenIds(ids=_ids(512, n + i)))), 1.0, 60, False)
    else:
        _unary_flood(ctx, 100, lambda i: ("/rmscore/v1/score", _score_body([{"tokens": _ids(512, i)}])), every_s=1.0)


def a_streams_conns(ctx):
    """Defect 4 variant: 40 connections, each with 2 streams sending a 512-token item every 0.5 s (HTTP:
    80 callers, a 16 x 512 request every 2 s each)."""
    if ctx["transport"] == "grpc":
        pb, _ = _pb()
        _streams(ctx, 80, lambda i, n, sid: pb.ScoreStreamRequest(
            id=sid, sequence=pb.Sequence(tokens=pb.TokenIds(ids=_ids(512, n + i)))), 2.0, 120, True)
    else:
        _unary_flood(ctx, 80, lambda i: ("/rmscore/v1/score", _score_body([{"tokens": _ids(512, i + k)}
                                                                          for k in range(16)])), every_s=2.0)


def a_batches_80(ctx):
    """Defect 4 variant, gRPC: 80 callers (a connection each), each sending a 16 x 512 Score every 2 s
    with a 20 s deadline: streams_80_conns's HTTP load as unary calls. Every request queued beside 79
    others ends its last sequence after its deadline unless admission holds the deadline to it."""
    _unary_flood(ctx, 80, lambda i: _tok_request([_ids(512, i + k) for k in range(16)]), every_s=2.0)


def a_burst_300(ctx):
    """Defect 6: 300 one-sequence calls at once on a fresh channel, every 2 s (HTTP: 300 connections at once)."""
    _burst(ctx, 300, 2.0)


def a_burst_1000(ctx):
    """Defect 6 variant: 1000 calls at once on one fresh channel, every 3 s (HTTP: 200 connections)."""
    _burst(ctx, 1000 if ctx["transport"] == "grpc" else 200, 3.0)


def _burst(ctx, n: int, every_s: float) -> None:
    tally, until = ctx["tally"], ctx["until"]
    seq = _ids(16)
    while time.monotonic() < until:
        t = time.monotonic()
        if ctx["transport"] == "grpc":
            pb, pbg = _pb()
            ch = _grpc_channel(ctx["target"], True)
            stub = pbg.RewardModelStub(ch)
            req = _tok_request([seq])
            futs = [stub.Score.future(req, timeout=CALL_DEADLINE_S) for _ in range(n)]
            for f in futs:
                tally.add(_grpc_outcome(f.result))
            ch.close()
        else:
            import httpx
            body = _score_body([{"tokens": seq}])

            def one(_):
                with httpx.Client(base_url=ctx["base_url"], timeout=CALL_DEADLINE_S + 5) as c:
                    return _http_outcome(c, "/rmscore/v1/score", body)
            with ThreadPoolExecutor(n) as ex:
                for o in ex.map(one, range(n)):
                    tally.add(o)
        time.sleep(max(0.0, every_s - (time.monotonic() - t)))


def a_text_huge(ctx):
    """Defect 3: 2 callers send one 15 MiB text (over --max-text-chars: refused), back to back: /get_reward
    on HTTP, Score with text on gRPC. The C++ kind takes no text (refused the same way)."""
    text = "lorem ipsum " * (15 * (1 << 20) // 12)
    if ctx["transport"] == "grpc":
        pb, _ = _pb()
        _unary_flood(ctx, 2, lambda i: pb.ScoreRequest(sequences=[pb.Sequence(
            text=pb.TextPair(prompt="q", response=text))], truncation=1))
    else:
        _unary_flood(ctx, 2, lambda i: ("/get_reward", json.dumps({"query": [text]}).encode()))


def a_text_cap(ctx):
    """Defect 3 variant: 6 callers send 8 texts of 130000 characters (just under the cap) with truncation,
    back to back (HTTP: /rmscore/v1/score), each text different."""
    def seqs(i):
        return [{"prompt": "q", "response": f"{i} {k} " + "lorem ipsum dolor sit amet " * 4814} for k in range(8)]
    if ctx["transport"] == "grpc":
        pb, _ = _pb()
        _unary_flood(ctx, 6, lambda i: pb.ScoreRequest(sequences=[pb.Sequence(
            text=pb.TextPair(**s)) for s in seqs(i)], truncation=1))
    else:
        _unary_flood(ctx, 6, lambda i: ("/rmscore/v1/score", _score_body(seqs(i), "left")))


def a_score_pairs(ctx):
    """Defect 3 (HTTP): /score with text_1 and 1024 distinct text_2 of 1000 characters (the most
    accepted: 4096 are refused 400 at once), 4 callers."""
    if ctx["transport"] != "http":
        return
    _unary_flood(ctx, 4, lambda i: ("/score", json.dumps(
        {"text_1": "query " * 100, "text_2": [f"{i} {k} " + "doc " * 250 for k in range(1024)]}).encode()))


def a_slow_headers(ctx):
    """Defect 7: 64 connections send a request's headers (HTTP) or the HTTP/2 preface (gRPC) a byte
    every 0.5 s for the whole attack."""
    tally, until = ctx["tally"], ctx["until"]
    msg = (b"POST /rmscore/v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"X-Pad: " + b"a" * 4096 + b"\r\n\r\n") if ctx["transport"] == "http" else \
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0" * 4096)
    socks = []
    for _ in range(64):
        try:
            socks.append(socket.create_connection(("127.0.0.1", ctx["port"]), timeout=2))
        except OSError:
            tally.add("connect-refused")
    pos, closed = 0, set()
    while time.monotonic() < until and pos < len(msg):
        for j, s in enumerate(socks):
            if j in closed:
                continue
            try:
                s.send(msg[pos:pos + 1])
            except OSError:
                closed.add(j)
        pos += 1
        time.sleep(0.5)
    tally.c["connections"] = len(socks)
    tally.c["closed_by_server"] = len(closed)
    for s in socks:
        s.close()


def a_stalled_bodies(ctx):
    """Defect 7: 16 connections each announce a 12 MiB body and send all but its last byte, then hold."""
    from rmscore_tools.reliability import transport as tr
    tally, until = ctx["tally"], ctx["until"]
    socks = []
    for _ in range(16):
        if time.monotonic() >= until:
            break
        try:
            if ctx["transport"] == "http":
                socks.append(tr._stall_http(ctx["port"], 12 << 20, 5.0))
            else:
                socks.append(tr._stall_grpc(ctx["port"], 12 << 20, 5.0))
        except Exception:  # noqa: BLE001
            tally.add("stall-failed")
    tally.c["connections"] = len(socks)
    while time.monotonic() < until:
        time.sleep(0.2)
    for s in socks:
        s.close()


ATTACKS = {
    # name: (function, family, kinds it applies to: None = all)
    "trunc_max_unary": (a_trunc_max, "1 truncation", None),
    "trunc_1M_refused": (a_trunc_over, "1 truncation", None),
    "trunc_1M_spelled": (a_trunc_spelled, "1 truncation", ("http",)),
    "trunc_16x32k": (a_trunc_wide, "1 truncation", None),
    "long_ints_15MiB": (a_long_ints, "3 parsing", ("http",)),
    "containers_5M": (a_containers, "3 parsing", ("http",)),
    "trunc_stream": (a_trunc_stream, "1 truncation", ("grpc",)),
    "text_15MiB": (a_text_huge, "3 text", ("py",)),
    "text_cap_8x130k": (a_text_cap, "3 text", ("py",)),
    "score_1024_pairs": (a_score_pairs, "3 text", ("http",)),
    "big_1024x512": (a_big_request, "4/5 share+bytes", None),
    "big_1024x512_x4conn": (a_big_bodies, "4/5 share+bytes", None),
    "streams_100": (a_streams_100, "4 share", None),
    "streams_80_conns": (a_streams_conns, "4 share", None),
    "batches_80_callers": (a_batches_80, "4 share", ("grpc",)),
    "burst_300": (a_burst_300, "6 streams limit", None),
    "burst_1000": (a_burst_1000, "6 streams limit", None),
    "slow_headers_64": (a_slow_headers, "7 slow clients", None),
    "stalled_bodies_16x12MiB": (a_stalled_bodies, "7 slow clients", None),
}


def applies(name: str, kind: str) -> bool:
    only = ATTACKS[name][2]
    if only is None:
        return True
    tr = launch.transport(kind)
    return any(o == tr or (o == "py" and kind.startswith("py")) for o in only)


def _attacker(name: str, ctx: dict, q) -> None:
    ctx = dict(ctx, tally=_Tally())
    try:
        ATTACKS[name][0](ctx)
        err = ""
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"[:300]
    q.put({"counts": dict(ctx["tally"].c), "refusals": refusal_figures(ctx["tally"].refusal_ms), "error": err})


# ---- one attack, one kind ----------------------------------------------------------------------

def _prober(server):
    from rmscore_tools import caller
    p = subprocess.Popen([sys.executable, "-m", "rmscore_tools.reliability.prober", server.transport,
                          caller.target_of(server),
                          str(PROBE_INTERVAL_S), str(PROBE_TIMEOUT_S)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "ready"
    return p


def _alive(server) -> bool:
    if server.proc.poll() is not None:
        return False
    try:
        return server.is_ready()
    except Exception:  # noqa: BLE001
        return False


def run_attack(server, kind: str, name: str, seconds: float, settle_s: float) -> dict:
    pid = server.proc.pid
    row = {"kind": kind, "attack": name, "family": ATTACKS[name][1], "load_start": loadavg()}
    row["baseline_mib"] = rss_mib(pid)
    prober = _prober(server)
    ctx = {"transport": server.transport, "target": server.target, "port": server.port,
           "base_url": server.base_url if server.transport == "http" else "",
           "until": time.monotonic() + seconds}
    mp = multiprocessing.get_context("spawn")
    q = mp.Queue()
    # `until` is monotonic: the clock is system-wide on Linux, so the child reads it alike.
    att = mp.Process(target=_attacker, args=(name, ctx, q), daemon=True)
    t0 = time.monotonic()
    att.start()
    peak = row["baseline_mib"]
    out = None
    hard_end = ctx["until"] + CALL_DEADLINE_S + 15
    while time.monotonic() < hard_end:
        if server.proc.poll() is None:
            peak = max(peak, rss_mib(pid))
        try:
            out = q.get(timeout=0.1)
            break
        except Exception:  # noqa: BLE001
            pass
    att.join(2)
    if att.is_alive():
        att.kill()
        att.join()
    row["attack_s"] = time.monotonic() - t0
    prober.stdin.write("\n")
    prober.stdin.flush()
    probes = json.loads(prober.stdout.readline() or "[]")
    prober.wait(10)
    row.update(probe_figures(probes))
    row["peak_over_mib"] = peak - row["baseline_mib"]
    end = time.monotonic() + settle_s
    while time.monotonic() < end and server.proc.poll() is None:
        time.sleep(0.2)
    row["after_mib"] = rss_mib(pid) if server.proc.poll() is None else None
    row["alive"] = _alive(server)
    counts = (out or {}).get("counts", {})
    row["calls"] = counts
    row["lost"] = sum(v for k, v in counts.items() if k.startswith("LOST")) if out else None
    row["call_refusals"] = (out or {}).get("refusals")
    row["attacker_error"] = (out or {}).get("error", "attacker did not report")
    row["load_end"] = loadavg()
    return row


def run_kind(kind: str, attacks: list[str], seconds: float, settle_s: float, log, flags: dict | None = None,
             env: dict | None = None) -> list[dict]:
    rows = []
    server = launch.start(kind, env=env, **(flags or {}))
    try:
        from rmscore_tools import caller  # warm: one good call before the baseline
        from rmscore_tools.reliability.faults import _probe_score
        from rmscore_tools.reliability.transport import PROBE_IDS
        c = caller.Caller(server.transport, caller.target_of(server), timeout_s=30)
        _probe_score(c, PROBE_IDS, 30)
        c.close()
        time.sleep(1)
        for name in attacks:
            if not applies(name, kind):
                continue
            if server.proc.poll() is not None:
                rows.append({"kind": kind, "attack": name, "family": ATTACKS[name][1], "skipped": "server dead"})
                continue
            row = run_attack(server, kind, name, seconds, settle_s)
            log(format_row(row))
            rows.append(row)
    finally:
        server.stop()
    return rows


# ---- report ------------------------------------------------------------------------------------

COLUMNS = ["kind", "attack", "load", "probes ok/ref/t.o.", "slow ref", "p50 ms", "p99 ms", "max ms",
           "base MiB", "peak +MiB", "after MiB (vs base)", "alive", "calls sent/ok/refused",
           "calls' refusals p50/p99 ms (slow)", "lost"]


def _n(x, d: int = 0) -> str:
    return "-" if x is None else f"{x:.{d}f}"


def format_row(r: dict) -> str:
    if "skipped" in r:
        return f"| {r['kind']} | {r['attack']} | " + " | ".join(["-"] * (len(COLUMNS) - 3)) + f" | {r['skipped']} |"
    calls = r.get("calls", {})
    sent = calls.get("sent", 0)
    ok = calls.get("OK", 0)
    lost = r.get("lost")
    refused = sent - ok - (lost or 0)
    after = r.get("after_mib")
    rel = "-" if after is None else f"{after:.0f} ({(after / r['baseline_mib'] - 1) * 100:+.1f}%)"
    cells = [r["kind"], r["attack"], r.get("load_start", "-").split()[0],
             f"{r['served']}/{r['refused']}/{r['timed_out']}", str(r["slow_refusals"]),
             _n(r["p50_ms"], 1), _n(r["p99_ms"], 1), _n(r["max_ms"], 0),
             _n(r["baseline_mib"]), _n(r["peak_over_mib"]), rel, "yes" if r["alive"] else "NO",
             f"{sent}/{ok}/{refused}", _refusals_cell(r.get("call_refusals")), "-" if lost is None else str(lost)]
    return "| " + " | ".join(cells) + " |"


def _refusals_cell(f: dict | None) -> str:
    """The attack's own timed refusals; "-" where none were timed (stream items, raw-socket attacks)."""
    if not f or not f.get("n"):
        return "-"
    return f"{_n(f['p50_ms'], 1)}/{_n(f['p99_ms'], 1)} ({f['slow']})"


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "\n".join(format_row(r) for r in rows) + "\n"


def verdict(r: dict, budget_mib: float = 1024.0) -> dict:
    """The goal's checks on one row: probes (every one answered within its deadline, or refused in
    under 100 ms), memory (peak <= 10% of baseline + budget; after within 10% of baseline), alive, lost."""
    if "skipped" in r:
        return {"probes": False, "peak": False, "after": False, "alive": False, "lost": False}
    return {"probes": r["timed_out"] == 0 and r["slow_refusals"] == 0,
            "peak": r["peak_over_mib"] <= 0.1 * r["baseline_mib"] + budget_mib,
            "after": r["after_mib"] is not None and r["after_mib"] <= 1.1 * r["baseline_mib"],
            "alive": bool(r["alive"]),
            "lost": r.get("lost") == 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime"])
    ap.add_argument("--attacks", nargs="+", default=list(ATTACKS))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--json", default="", help="write the rows as JSON here")
    ap.add_argument("--flag", action="append", default=[], metavar="NAME=VALUE",
                    help="a server flag, docs/contract.md's name with underscores (repeatable; default: none, "
                         "every server on its defaults)")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                    help="added to each server's environment (repeatable; default: none)")
    args = ap.parse_args(argv)
    flags = dict(f.split("=", 1) for f in args.flag)
    env = dict(f.split("=", 1) for f in args.server_env)
    head = (f"CPU: {cpu_model()} x {os.cpu_count()}; load average at start: {loadavg()}; "
            f"commit {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}"
            + (f"; server flags {flags}" if flags else "") + (f"; server environment {env}" if env else ""))
    print(head, flush=True)
    print(table([]), end="", flush=True)
    rows = []
    for kind in args.kinds:
        try:
            rows += run_kind(kind, args.attacks, args.seconds, args.settle, lambda s: print(s, flush=True), flags, env)
        except Exception as e:  # noqa: BLE001
            print(f"{kind}: {type(e).__name__}: {e}", flush=True)
    print()
    print(head)
    print(table(rows))
    for r in rows:
        v = verdict(r)
        miss = [k for k, ok in v.items() if not ok]
        print(f"{r['kind']:9} {r['attack']:26} {'holds' if not miss else 'MISS: ' + ', '.join(miss)}"
              + (f"  refusals {r.get('refusal_codes')}" if r.get("refused") else "")
              + (f"  attacker: {r.get('attacker_error')}" if r.get("attacker_error") else "")
              + f"  calls {r.get('calls')}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"head": head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
