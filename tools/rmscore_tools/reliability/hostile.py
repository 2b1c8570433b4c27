"""A corpus of hostile requests, runnable against any server kind: `run_corpus(kind, host, port, transport)`.

Every case is data (`Case`): what to send and the outcome the contract
(docs/contract.md, "Errors") asks for, as a code name and a regex on the
message. A good request (the golden sequences of the model's manifest) follows
every bad case and must still get the golden scores, and every call has a
timeout: an answer that never comes counts as a stall. The cases, by group:

Both transports (the same request as a protobuf message or as JSON):
  - empty request, a sequence with no input, an empty id list;
  - token ids -1, -2**63, 2**63-1 and vocab_size (just past the end);
  - one sequence of max_sequence_length + 1 ids, and one of 1M ids, with no
    truncation (refused), and over-long sequences cut LEFT / RIGHT (scored: the
    kept window is a golden sequence, so the score is known);
  - max_sequences_per_request + 1 sequences, and ~100k tiny sequences (as
    many as fit well under the message limit): refused by count;
  - max_sequences_per_request tiny sequences (accepted, all scored), and
    "deeply mixed lengths": 1-token sequences next to 512-token ones and the
    golden lengths in between, in one request: accepted, each score equal to
    that sequence scored alone (the golden score), whatever the batching;
  - token ids and text mixed in one request;
  - text: control characters / NUL / BOM / bidi overrides (scored), prompt and
    response both empty (refused), very long text with no truncation (refused
    by length after tokenizing) and with truncation (scored), a text over the
    default --max-text-chars (refused before tokenizing). A server that
    does not tokenize (ModelInfo.accepts_text false, the C++ one) refuses every
    text case with its own message instead;
  - a message larger than max_request_bytes: RESOURCE_EXHAUSTED / 413, the
    transport's own message on gRPC (the receive limit is grpc's).

gRPC only:
  - protobuf that does not parse (truncated, garbage, a wrong wire type, an
    11-byte varint, a string that is not UTF-8): INVALID_ARGUMENT;
  - 2**64-1 written as a varint (reads as int64 -1): refused as token id -1;
  - zero bytes (a valid, empty ScoreRequest): "empty request";
  - unknown fields at the top level and inside Sequence / TokenIds: proto3
    ignores unknown fields by design (forward compatibility: an older server
    must accept a newer client's message), so the expected outcome is success
    with the golden scores; likewise unpacked repeated ids (a valid encoding);
  - an unknown Truncation enum value: refused, never read as NONE;
  - ScoreStream: items with no id, duplicate ids, bad items among good ones,
    an unknown truncation value, an empty stream. Each item gets its own
    answer (score or error), the stream stays open.

HTTP only:
  - malformed JSON (cut short, trailing garbage, not JSON, invalid UTF-8,
    nesting 100k deep, a 5000-digit number), and JSON of the wrong shape: a
    string / object / null where a list belongs, nested arrays, ids as strings,
    fractional or integral floats, booleans, NaN, 1e400, integers past int64;
  - unknown fields (top level, in a sequence) and a sequence with both tokens
    and text: refused (the JSON schema is closed);
  - wrong or missing content-type, a body over max_request_bytes with and
    without Content-Length (chunked), a Content-Length that is not a number;
  - GET / PUT / DELETE on /rmscore/v1/score: 405;
  - Unicode escapes: valid ones (accents, a surrogate pair, \\u0000) scored, a
    lone surrogate refused; timeout_ms <= 0 refused, 1e308 accepted (no deadline).
"""

from __future__ import annotations

import json
import pathlib
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from rmscore_tools import launch

ROOT = launch.ROOT
DEFAULT_MODEL_DIR = ROOT / "models" / "default"
DEFAULT_MAX_REQUEST_BYTES = 16 << 20  # docs/contract.md's default for --max-request-bytes
CALL_TIMEOUT_S = 30.0
# HTTP status each contract code comes with (docs/contract.md); 413 is the size limit's.
HTTP_STATUS = {"OK": 200, "INVALID_ARGUMENT": 422, "RESOURCE_EXHAUSTED": 413, "UNAVAILABLE": 503,
               "DEADLINE_EXCEEDED": 504, "INTERNAL": 500}
MALFORMED_PROTO = r"^request: malformed ScoreRequest: the bytes do not parse as protobuf$"
MALFORMED_STREAM_ITEM = r"^request: malformed ScoreStreamRequest: the bytes do not parse as protobuf$"
TEXT_REFUSED = r"\.text: this server does not tokenize text; send token ids"


@dataclass(frozen=True)
class Expect:
    code: str  # contract code name ("OK", "INVALID_ARGUMENT", ...) or "HTTP_<status>" for plain HTTP errors
    message: str = ""  # regex searched in the message
    scores: tuple[float, ...] | None = None  # on OK: the scores wanted, in order
    tolerance: float | None = None  # overrides the kind's golden tolerance


@dataclass(frozen=True)
class StreamItem:
    id: str
    request: Any  # pb.ScoreStreamRequest
    expect: Expect


@dataclass(frozen=True)
class Case:
    """One hostile input. Exactly one of the request fields is set."""

    name: str
    transport: str  # "grpc", "http" or "both"
    expect: Expect
    seqs: list | None = None  # portable: [{"tokens": [...]}, {"prompt":.., "response":..}, {}]
    truncation: str = "none"
    grpc_request: Any = None  # a pb.ScoreRequest, or raw bytes sent to Score as they are
    stream: list[StreamItem] | None = None
    stream_raw: list[bytes] | None = None  # ScoreStream items as raw bytes; `expect` is the call's status
    http_body: Any = None  # bytes, or an iterator of bytes (sent chunked)
    http_method: str = "POST"
    http_headers: dict = field(default_factory=dict)
    http_raw: bytes | None = None  # a whole HTTP/1.1 request, written to a socket
    text: bool = False  # text input: a server without a tokenizer refuses it
    note: str = ""


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_sequence_length: int
    max_sequences_per_request: int
    max_request_bytes: int
    accepts_text: bool


def _golden(model_dir: pathlib.Path) -> tuple[list[list[int]], list[float]]:
    m = json.loads((pathlib.Path(model_dir) / "manifest.json").read_text())
    return [g["input_ids"] for g in m["golden"]], [g["score"] for g in m["golden"]]


def tolerance(kind: str) -> float:
    """tests/harness.py's: inductor reorders float reductions, the other runtimes do not."""
    return 1e-4 if "compile" in kind else 1e-5


# ---- the corpus -------------------------------------------------------------------------------

def corpus(limits: Limits, model_dir: pathlib.Path = DEFAULT_MODEL_DIR) -> list[Case]:
    from rmscore_client.v1 import reward_pb2 as pb

    gids, gscores = _golden(model_dir)
    V, L, N = limits.vocab_size, limits.max_sequence_length, limits.max_sequences_per_request
    one = min(range(len(gids)), key=lambda i: len(gids[i]))  # the 1-token golden sequence
    longest = max(range(len(gids)), key=lambda i: len(gids[i]))
    invalid = lambda rx: Expect("INVALID_ARGUMENT", rx)  # noqa: E731
    ok = lambda *s, tol=None: Expect("OK", "", tuple(s), tol)  # noqa: E731
    T = lambda ids: {"tokens": list(ids)}  # noqa: E731
    cases: list[Case] = []

    def both(name, seqs, expect, truncation="none", text=False, note=""):
        cases.append(Case(name, "both", expect, seqs=seqs, truncation=truncation, text=text, note=note))

    # ---- both transports: ids, counts, lengths
    both("empty request", [], invalid(r"^sequences: empty request, send at least one sequence$"))
    both("no input set", [T([101]), {}], invalid(r"^sequences\[1\]: no input set, send tokens or text$"))
    both("empty sequence", [T([])], invalid(r"^sequences\[0\]\.tokens\.ids: empty sequence$"))
    for name, bad in (("negative id", -1), ("int64 min id", -2**63), ("int64 max id", 2**63 - 1),
                      ("id = vocab_size", V)):
        both(name, [T(gids[0]), T([101, bad, 102])],
             invalid(rf"^sequences\[1\]\.tokens\.ids\[1\]: token id {bad} is outside the vocabulary \[0, {V}\)$"))
    both("one past max length", [T([1037] * (L + 1))],
         invalid(rf"^sequences\[0\]: length {L + 1} exceeds max_sequence_length {L} \(set truncation to cut it\)$"))
    n_big = min(1_000_000, limits.max_request_bytes // 4)
    # Past 64 x max_sequence_length a sequence is refused before its ids are read, truncation or not.
    for trunc in ("none", "left"):
        both(f"1M ids, truncation {trunc}", [T([7] * n_big)],
             invalid(rf"^sequences\[0\]\.tokens\.ids: length {n_big} exceeds {64 * L}, the most a sequence may "
                     rf"send even with truncation"), trunc)
    both("64 x max length, truncation left", [T([1037] * (64 * L - len(gids[longest])) + gids[longest])],
         ok(gscores[longest], tol=1e-4), "left", note="the longest input truncation takes")
    g = gids[longest]
    both("too long, truncation left", [T([1037] * 100 + g)], ok(gscores[longest], tol=1e-4), "left",
         note="left keeps the last max_sequence_length ids: exactly a golden sequence")
    both("too long, truncation right", [T(g + [1037] * 100)], ok(gscores[longest], tol=1e-4), "right")
    both("max_sequences_per_request + 1", [T([101])] * (N + 1),
         invalid(rf"^sequences: {N + 1} sequences exceed max_sequences_per_request {N}$"))
    n_many = max(N + 1, min(100_000, limits.max_request_bytes // 40))
    both("~100k tiny sequences", [T([101])] * n_many,
         invalid(rf"^sequences: {n_many} sequences exceed max_sequences_per_request {N}$"),
         note="as many as fit well under max_request_bytes in either encoding")
    both("max_sequences_per_request tiny sequences", [T(gids[one])] * N, ok(*[gscores[one]] * N, tol=1e-4))
    order = [one, longest] * 4 + list(range(len(gids))) + [longest, one] * 4
    order = order[:N]
    both("deeply mixed lengths", [T(gids[i]) for i in order], ok(*[gscores[i] for i in order], tol=1e-4),
         note="1 token next to max length: batching and padding must not change a score")
    both("ids and text mixed", [T([101]), {"prompt": "a", "response": "b"}],
         invalid(r"^sequences\[1\]: mixes text and token ids in one request"))

    # ---- both transports: text
    both("text with control characters", [{"prompt": "a\x00\x01\x1b[31m\x7f\u202e\ufeff", "response": "b\r\n\t"}],
         Expect("OK"), text=True, note="control characters are text: tokenized, scored")
    both("text both empty", [{"prompt": "", "response": ""}],
         invalid(r"^sequences\[0\]\.text: prompt and response are both empty$"), text=True)
    # Under --max-text-chars' default (256 x max_sequence_length characters), yet far over the window.
    long_text = "hello world " * (256 * L // 12)
    both("very long text, no truncation", [{"prompt": long_text, "response": "ok"}],
         invalid(r"^sequences\[0\]: length \d+ exceeds max_sequence_length"), text=True)
    both("very long text, truncation left", [{"prompt": long_text, "response": "ok"}], Expect("OK"), "left",
         text=True)
    both("text over max_text_chars, truncation left", [{"prompt": "why?", "response": "x" * (256 * L + 1)}],
         invalid(rf"^sequences\[0\]\.text\.response: {256 * L + 1} characters exceed max_text_chars {256 * L}; "),
         "left", text=True, note="refused before anything is tokenized (issue 29, defect 3)")

    # ---- both transports: size
    n_over = limits.max_request_bytes // 3 + 4096  # id 30000 is 3 bytes as a varint, 6 as JSON text
    cases.append(Case("message over max_request_bytes", "grpc",
                      Expect("RESOURCE_EXHAUSTED", r"Received message larger than max"),
                      grpc_request=_Lazy(lambda: pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(
                          ids=[30000] * n_over))]).SerializeToString()),
                      note="grpc's own receive limit, set from --max-request-bytes"))
    over_body = _Lazy(lambda: b'{"sequences": [{"tokens": [' + b"30000," * n_over + b'1]}]}')
    cases.append(Case("body over max_request_bytes", "http",
                      Expect("RESOURCE_EXHAUSTED", rf"exceeds max_request_bytes {limits.max_request_bytes}"),
                      http_body=over_body))
    cases.append(Case("chunked body over max_request_bytes", "http",
                      Expect("RESOURCE_EXHAUSTED", rf"exceeds max_request_bytes {limits.max_request_bytes}"),
                      http_body=_chunks(over_body), note="no Content-Length: the limit must count bytes read"))

    cases += _grpc_cases(pb, limits, gids, gscores, ok, invalid)
    cases += _http_cases(limits, gids, gscores, ok, invalid)
    return cases


def _chunks(body: "_Lazy", size: int = 1 << 16):
    def gen():
        b = body()
        for i in range(0, len(b), size):
            yield b[i:i + size]
    return _Replayable(gen)


class _Lazy:
    """A large payload built only when sent, so listing the corpus stays cheap."""

    def __init__(self, make):
        self.make = make

    def __call__(self):
        return self.make()


class _Replayable:
    """An iterable body that can be sent more than once (each run gets a fresh generator)."""

    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return iter(self.make())


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field_no: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(field_no << 3 | 2) + _varint(len(payload)) + payload


def _grpc_cases(pb, limits, gids, gscores, ok, invalid) -> list[Case]:
    V = limits.vocab_size
    cases = []

    def g(name, request, expect, note=""):
        cases.append(Case(name, "grpc", expect, grpc_request=request, note=note))

    good = pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=gids[0]))]).SerializeToString()
    g("truncated protobuf", good[:-3], invalid(MALFORMED_PROTO))
    g("garbage bytes", b"\xff\xff\xff\xff\xff\xff", invalid(MALFORMED_PROTO))
    g("wrong wire type for sequences", _varint(1 << 3 | 0) + _varint(5), invalid(r"^sequences: empty request"),
      note="field 1 (a message) sent as a varint: parsers keep a known field with the wrong wire type as an "
           "unknown field, so this is a valid, empty request")
    g("11-byte varint", _varint(2 << 3 | 0) + b"\xff" * 10 + b"\x01", invalid(MALFORMED_PROTO))
    text_seq = _ld(2, _ld(1, b"\xff\xfe bad") + _ld(2, b"ok"))
    g("text that is not UTF-8", _ld(1, text_seq), invalid(MALFORMED_PROTO),
      note="proto3 strings must be UTF-8: the parser refuses, on every kind, before any tokenizer")
    g("2**64-1 as a varint id", _ld(1, _ld(1, _ld(1, _varint(101) + _varint(2**64 - 1)))),
      invalid(rf"^sequences\[0\]\.tokens\.ids\[1\]: token id -1 is outside the vocabulary \[0, {V}\)$"),
      note="int64 on the wire: the 10-byte varint of 2**64-1 is -1")
    g("zero bytes", b"", invalid(r"^sequences: empty request"), note="a valid, empty ScoreRequest")
    unknown = (_varint(15 << 3 | 0) + _varint(12345) + _ld(99, b"from a newer client") +
               _varint(1000 << 3 | 5) + b"\x00\x00\x80\x3f")
    ids = b"".join(_varint(i) for i in gids[0])
    g("unknown fields", good + unknown, ok(gscores[0]),
      note="proto3 ignores unknown fields by design (forward compatibility): success is the contract")
    nested = _ld(1, _ld(1, _ld(1, ids) + _ld(7, b"x")) + _varint(9 << 3 | 0) + _varint(1))
    g("unknown fields in Sequence and TokenIds", nested, ok(gscores[0]), note="as above, one level down")
    unpacked = _ld(1, _ld(1, b"".join(_varint(1 << 3 | 0) + _varint(i) for i in gids[0])))
    g("unpacked repeated ids", unpacked, ok(gscores[0]), note="a valid encoding every parser must accept")
    seq = pb.Sequence(tokens=pb.TokenIds(ids=gids[0]))
    g("unknown truncation value", pb.ScoreRequest(sequences=[seq], truncation=7),
      invalid(r"^truncation: unknown value 7"), note="proto3 enums are open: 7 arrives as 7, never as NONE")

    # ---- ScoreStream
    def item(id_, ids=None, truncation=0, text=None):
        s = pb.Sequence(tokens=pb.TokenIds(ids=ids)) if ids is not None else \
            pb.Sequence(text=pb.TextPair(prompt=text[0], response=text[1])) if text else pb.Sequence()
        return pb.ScoreStreamRequest(id=id_, sequence=s, truncation=truncation)

    def s(name, items, note=""):
        cases.append(Case(name, "grpc", Expect("OK"), stream=[StreamItem(*it) for it in items], note=note))

    s("stream: items with no id", [("", item("", gids[0]), ok(gscores[0])),
                                   ("", item("", gids[1]), ok(gscores[1]))],
      note="answered with id '' each; the client cannot tell them apart, the server does not care")
    s("stream: duplicate ids", [("d", item("d", gids[0]), ok(gscores[0])),
                                ("d", item("d", [V]), invalid(r"^sequence\.tokens\.ids\[0\]: token id")),
                                ("d", item("d", gids[2]), ok(gscores[2]))])
    bad_good = []
    for i in range(6):
        bad_good.append((f"g{i}", item(f"g{i}", gids[i]), ok(gscores[i])))
    bad_good[1:1] = [("neg", item("neg", [101, -5]), invalid(r"^sequence\.tokens\.ids\[1\]: token id -5 is outside")),
                     ("none", item("none"), invalid(r"^sequence: no input set"))]
    bad_good[4:4] = [("long", item("long", [7] * (limits.max_sequence_length + 1)),
                      invalid(r"^sequence: length \d+ exceeds max_sequence_length")),
                     ("empty", item("empty", []), invalid(r"^sequence\.tokens\.ids: empty sequence$"))]
    s("stream: bad items among good ones", bad_good)
    s("stream: unknown truncation value", [("t", item("t", gids[0], truncation=9),
                                            invalid(r"^truncation: unknown value 9")),
                                           ("u", item("u", gids[1]), ok(gscores[1]))])
    s("stream: no items", [])
    raw_item = lambda id_: item(id_, gids[0]).SerializeToString()  # noqa: E731
    cases.append(Case("stream: malformed item", "grpc", invalid(MALFORMED_STREAM_ITEM),
                      stream_raw=[raw_item("a"), b"\xff\xff\xff", raw_item("b")],
                      note="an item that does not parse has no id to answer: the call ends with "
                           "INVALID_ARGUMENT, never with OK (items silently dropped) or a stall"))
    return cases


def _http_cases(limits, gids, gscores, ok, invalid) -> list[Case]:
    cases = []
    good = {"sequences": [{"tokens": gids[0]}]}

    def h(name, body, expect, headers=None, method="POST", note=""):
        if not isinstance(body, (bytes, _Replayable)) and body is not None:
            body = json.dumps(body).encode()
        cases.append(Case(name, "http", expect, http_body=body, http_method=method,
                          http_headers=headers or {}, note=note))

    def seqs(*items, **top):
        return {"sequences": list(items), **top}

    # malformed JSON: the body cannot be decoded at all
    h("JSON cut short", b'{"sequences": [{"tokens": [101,', invalid(r"^body: malformed JSON"))
    h("JSON with trailing garbage", json.dumps(good).encode() + b"}}", invalid(r"^body: malformed JSON"))
    h("not JSON", b"sequences=101,102", invalid(r"^body"))
    h("invalid UTF-8 in JSON", b'{"sequences": [{"prompt": "\xff\xfe", "response": "x"}]}',
      invalid(r"^body: "))
    h("JSON nested 100k deep", b'{"sequences": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
      invalid(r"^body: "))
    h("5000-digit number", b'{"sequences": [{"tokens": [' + b"9" * 5000 + b"]}]}", invalid(r"^(body|sequences)"))
    h("empty body", b"", invalid(r"^body: "))
    h("body is null", b"null", invalid(r"^body: "))
    h("body is an array", b"[1, 2]", invalid(r"^body: "))
    # wrong types
    h("tokens is a string", seqs({"tokens": "101 102"}), invalid(r"^sequences\.0\.tokens: "))
    h("sequences is an object", {"sequences": {"tokens": [101]}}, invalid(r"^sequences: "))
    h("sequences is null", {"sequences": None}, invalid(r"^sequences: "))
    h("tokens is null", seqs({"tokens": None}), invalid(r"^sequences\[0\]: no input set"))
    h("nested arrays as ids", seqs({"tokens": [[101, 102]]}), invalid(r"^sequences\.0\.tokens\.0: "))
    h("ids as strings", seqs({"tokens": ["101", "102"]}), invalid(r"^sequences\.0\.tokens\.0: "),
      note="no silent coercion: a string is not a token id")
    h("fractional float id", seqs({"tokens": [101.5]}), invalid(r"^sequences\.0\.tokens\.0: "))
    h("integral float id", seqs({"tokens": [101.0, 102.0]}), invalid(r"^sequences\.0\.tokens\.0: "))
    h("boolean ids", seqs({"tokens": [True, False]}), invalid(r"^sequences\.0\.tokens\.0: "),
      note="true is not token id 1")
    h("NaN id", b'{"sequences": [{"tokens": [NaN]}]}', invalid(r"^(body|sequences\.0\.tokens\.0): "))
    h("1e400 id", b'{"sequences": [{"tokens": [1e400]}]}', invalid(r"^(body|sequences\.0\.tokens\.0): "))
    for v in (2**63, 2**64 - 1, -2**63 - 1, 10**30):
        h(f"id {v} (past int64)", f'{{"sequences": [{{"tokens": [101, {v}]}}]}}'.encode(),
          invalid(rf"^sequences\[0\]\.tokens\.ids\[1\]: token id {v} is outside the vocabulary"))
    h("truncation not a known value", seqs({"tokens": [101]}, truncation="middle"), invalid(r"^truncation: "))
    h("truncation as a number", seqs({"tokens": [101]}, truncation=1), invalid(r"^truncation: "))
    # unknown fields: the JSON schema is closed, so a typo is an error, not a silent default
    h("unknown top-level field", seqs({"tokens": [101]}, truncate="left"), invalid(r"^truncate: "))
    h("unknown sequence field", seqs({"tokens": [101], "ids": [1]}), invalid(r"^sequences\.0\.ids: "))
    h("tokens and text in one sequence", seqs({"tokens": gids[0], "prompt": "a", "response": "b"}),
      invalid(r"^sequences\[0\]: sets both tokens and text"))
    # headers, methods
    h("content-type text/plain", good, invalid(r"^body: "), headers={"content-type": "text/plain"})
    h("no content-type", good, invalid(r"^body: "), headers={"content-type": ""})
    for m in ("GET", "PUT", "DELETE"):
        h(f"{m} /rmscore/v1/score", good if m == "PUT" else None, Expect("HTTP_405"), method=m)
    cases.append(Case("Content-Length not a number", "http", Expect("HTTP_400"),
                      http_raw=b"POST /rmscore/v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: abc\r\nConnection: close\r\n\r\n{}"))
    # Unicode escapes
    h("Unicode escapes", b'{"sequences": [{"prompt": "caf\\u00e9 \\ud83d\\ude00 \\u0000", "response": "\\u4e2d"}]}',
      Expect("OK"))
    h("lone surrogate escape", b'{"sequences": [{"prompt": "a\\ud800b", "response": "x"}]}',
      invalid(r"^sequences\[0\]\.text\.prompt: .*surrogate"))
    # deadlines
    h("timeout_ms zero", seqs({"tokens": [101]}, timeout_ms=0), invalid(r"^timeout_ms: "))
    h("timeout_ms negative", seqs({"tokens": [101]}, timeout_ms=-5), invalid(r"^timeout_ms: "))
    h("timeout_ms 1e308", seqs({"tokens": gids[0]}, timeout_ms=1e308), ok(gscores[0]),
      note="a deadline centuries away is no deadline")
    return cases


# ---- running it ------------------------------------------------------------------------------

class _Target:
    """The shared Caller, plus what only hostile input needs: outcomes as (code, message, payload)
    with a stall told apart from a refusal, and whole HTTP requests written to a socket."""

    def __init__(self, kind: str, host: str, port: int, transport: str, timeout_s: float):
        from rmscore_tools.caller import Caller

        self.kind, self.host, self.port, self.transport, self.timeout_s = kind, host, port, transport, timeout_s
        target = f"{host}:{port}" if transport == "grpc" else f"http://{host}:{port}"
        self.caller = Caller(transport, target, timeout_s=timeout_s, max_message_bytes=512 << 20)

    def close(self) -> None:
        self.caller.close()

    def limits(self, max_request_bytes: int) -> Limits:
        info = self.caller.info(timeout_s=self.timeout_s)
        return Limits(int(info["vocab_size"]), int(info["max_sequence_length"]),
                      int(info["max_sequences_per_request"]), max_request_bytes, bool(info["accepts_text"]))

    def alive(self) -> bool:
        return self.caller.is_serving(timeout_s=self.timeout_s) is True

    # Each send returns (code, message, scores or None); stream sends return one per item.
    def send(self, case: Case):
        from rmscore_tools.caller import CallError, score_request

        if self.transport == "http":
            return self._send_http(case)
        try:
            if case.stream is not None:
                return "STREAM", "", self.caller.stream([it.request for it in case.stream])
            if case.stream_raw is not None:
                answers = self.caller.stream(case.stream_raw)
                return "OK", f"stream ended OK after {len(answers)} answers for {len(case.stream_raw)} items", None
            req = case.grpc_request if case.grpc_request is not None else score_request(case.seqs, case.truncation)
            return "OK", "", list(self.caller.score_pb(req() if isinstance(req, _Lazy) else req).scores)
        except CallError as e:
            return _stall_or(e.code, e.message)

    def _send_http(self, case: Case):
        if case.http_raw is not None:
            return self._raw_http(case.http_raw)
        if case.seqs is not None:
            body = json.dumps({"sequences": case.seqs, "truncation": case.truncation}).encode()
            return self._http("POST", body, {})
        body = case.http_body() if isinstance(case.http_body, _Lazy) else case.http_body
        return self._http(case.http_method, body, case.http_headers)

    def _http(self, method: str, body, headers: dict):
        import httpx

        try:
            r = self.caller.http(method, "/rmscore/v1/score", body, headers)
        except httpx.TimeoutException as e:
            return "STALL", f"no answer in {self.timeout_s} s ({type(e).__name__})", None
        except httpx.HTTPError as e:
            return "CONNECTION_ERROR", f"{type(e).__name__}: {e}", None
        return _http_outcome(r.status_code, r.text)

    def _raw_http(self, raw: bytes):
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as s:
                s.sendall(raw)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except socket.timeout:
            return "STALL", f"no answer in {self.timeout_s} s", None
        except OSError as e:
            return "CONNECTION_ERROR", str(e), None
        m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
        if not m:
            return "CONNECTION_ERROR", f"not an HTTP answer: {data[:100]!r}", None
        return _http_outcome(int(m.group(1)), data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace"))


def _stall_or(code: str, message: str):
    # The client's own deadline: the server never answered.
    return ("STALL", f"no answer in time: {message}", None) if code == "DEADLINE_EXCEEDED" else (code, message, None)


def _http_outcome(status: int, text: str):
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if status == 200 and isinstance(body, dict) and "scores" in body:
        return "OK", "", body["scores"]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code, message = body["error"].get("code", ""), body["error"].get("message", "")
        if HTTP_STATUS.get(code) not in (status, None) and not (code == "RESOURCE_EXHAUSTED" and status == 429):
            code = f"{code}/HTTP_{status}"  # the right code name on the wrong status is still wrong
        return code, message, None
    return f"HTTP_{status}", text[:300], None


def _check(expect: Expect, code: str, message: str, scores, tol: float) -> str | None:
    """None when the outcome is the expected one, else what was wrong."""
    if code != expect.code:
        return f"{code}: {message[:300]}"
    if expect.message and not re.search(expect.message, message):
        return f"{code} with message {message[:300]!r}, wanted /{expect.message}/"
    if expect.scores is not None:
        t = expect.tolerance if expect.tolerance is not None else tol
        if scores is None or len(scores) != len(expect.scores):
            return f"OK with {None if scores is None else len(scores)} scores, wanted {len(expect.scores)}"
        worst = max((abs(a - b) for a, b in zip(scores, expect.scores)), default=0.0)
        if worst > t:
            return f"OK but scores off by {worst:.2e} (tolerance {t:.0e})"
    return None


def _effective(case: Case, limits: Limits) -> Expect:
    if case.text and not limits.accepts_text:
        return Expect("INVALID_ARGUMENT", TEXT_REFUSED)
    return case.expect


def _run_case(target: _Target, case: Case, limits: Limits, tol: float) -> dict:
    t0 = time.perf_counter()
    code, message, payload = target.send(case)
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    if case.stream is None:
        wrong = _check(_effective(case, limits), code, message, payload, tol)
    elif code != "STREAM":
        wrong = f"stream failed: {code}: {message[:300]}"
    else:
        wrong = _check_stream(case.stream, payload, tol)
        code = "OK"
    return {"case": case.name, "code": code, "message": message[:300], "elapsed_ms": elapsed_ms,
            "wrong": wrong, "expected": case.expect.code}


def _check_stream(items: list[StreamItem], answers, tol: float) -> str | None:
    """Each item answered once, by its id; order is free, so duplicate ids match as a multiset."""
    if len(answers) != len(items):
        return f"{len(answers)} answers for {len(items)} items"
    left = list(items)
    for a in answers:
        if a.WhichOneof("result") == "error":
            code, message, scores = _grpc_code_name(a.error.code), a.error.message, None
        else:
            code, message, scores = "OK", "", [a.score]
        match = next((it for it in left if it.id == a.id and _check(it.expect, code, message, scores, tol) is None),
                     None)
        if match is None:
            return f"item {a.id!r}: unexpected answer {code}: {message[:200]}"
        left.remove(match)
    return None


def _grpc_code_name(number: int) -> str:
    import grpc

    return next((c.name for c in grpc.StatusCode if c.value[0] == number), str(number))


def run_corpus(kind: str, host: str, port: int, transport: str, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               timeout_s: float = CALL_TIMEOUT_S, model_dir: pathlib.Path = DEFAULT_MODEL_DIR,
               names: list[str] | None = None, check_alive: bool = True) -> dict:
    """Run every case for `transport` against a running server, a good request after each one.

    `max_request_bytes` must be the server's --max-request-bytes (the contract's
    default unless told), so that the oversized cases are just over it.
    Returns the summary the hardening report prints, plus `results` (one dict per
    case: case, code, message, elapsed_ms, wrong, good_after_ok). `check_alive=False` skips the
    closing health check and good request (server_alive is then True): for a caller that runs
    the corpus a case at a time and checks once at the end.
    """
    target = _Target(kind, host, port, transport, timeout_s)
    try:
        limits = target.limits(max_request_bytes)
        cases = [c for c in corpus(limits, model_dir) if c.transport in ("both", transport)]
        if names is not None:
            cases = [c for c in cases if c.name in names]
        good = good_request(model_dir)
        tol = tolerance(kind)
        outcomes: dict[str, int] = {}
        unexpected, results = [], []
        good_correct, max_error_ms = 0, 0.0
        for case in cases:
            r = _run_case(target, case, limits, tol)
            outcomes[r["code"]] = outcomes.get(r["code"], 0) + 1
            if r["wrong"] is not None:
                unexpected.append({"case": case.name, "got": r["wrong"]})
            if _effective(case, limits).code != "OK":
                max_error_ms = max(max_error_ms, r["elapsed_ms"])
            g = _run_case(target, good, limits, tol)
            r["good_after_ok"] = g["wrong"] is None
            r["good_after"] = g["wrong"]
            good_correct += r["good_after_ok"]
            results.append(r)
        alive = not check_alive or (target.alive() and _run_case(target, good, limits, tol)["wrong"] is None)
        return {"kind": kind, "transport": transport, "inputs_tried": len(cases), "outcomes": outcomes,
                "unexpected": unexpected, "server_alive": alive,
                "good_between": len(cases), "good_between_correct": good_correct,
                "max_error_ms": round(max_error_ms, 1), "results": results}
    finally:
        target.close()


def good_request(model_dir: pathlib.Path = DEFAULT_MODEL_DIR, max_length: int = 64) -> Case:
    """The golden sequences up to `max_length` ids, in one request: cheap enough to follow every bad case
    (all 22, up to 512 ids, take seconds on a busy 2-core machine); the long ones are in the corpus."""
    gids, gscores = _golden(model_dir)
    keep = [i for i in range(len(gids)) if len(gids[i]) <= max_length]
    return Case("good request", "both", Expect("OK", "", tuple(gscores[i] for i in keep)),
                seqs=[{"tokens": gids[i]} for i in keep])


def case_names(transport: str) -> list[str]:
    """The names of the cases for `transport` (they do not depend on the server's limits)."""
    limits = Limits(30522, 512, 1024, DEFAULT_MAX_REQUEST_BYTES, True)
    return [c.name for c in corpus(limits) if c.transport in ("both", transport)]
