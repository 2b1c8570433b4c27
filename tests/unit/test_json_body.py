"""Large JSON bodies decode on a worker thread, one at a time, so a small request arriving with
several large ones is not queued behind all their decoding (frontends/json_body.py; the work
flood of docs/hardening.md, "A queue bounded by work").

Order, not time: a real FastAPI app (httpx's ASGI transport, in process) gets six ~2 MB bodies and
then a small one, all at once; the order in which the endpoint sees them is recorded. Decoded on
the event loop, each body's decoding is one step of its task, run first come first served, so the
small request comes last; behind the gate it comes before most of the large ones.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import sys
import threading

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from rmscore.core.errors import ScoreError
from rmscore.core.validation import INPUT_FACTOR, Limits, Validator
from rmscore.frontends import json_body
from rmscore.frontends.http_models import ScoreIn

BIG = json.dumps({"id": "big", "tokens": [[12345] * 512] * 400}).encode()  # ~2.6 MB


def app_recording(order: list[str], gated: bool) -> FastAPI:
    app = FastAPI()
    if gated:
        app.router.route_class = json_body.route_class()

    @app.post("/score")
    async def score(body: dict):
        order.append(body["id"] if body["id"] == "small" else f"big{len(order)}")
        return {"n": len(body.get("tokens", []))}

    return app


async def send_all(app: FastAPI) -> list[int]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        headers = {"content-type": "application/json"}
        big = [c.post("/score", content=BIG, headers=headers) for _ in range(6)]
        small = c.post("/score", json={"id": "small", "tokens": [[1, 2, 3]]})
        answers = await asyncio.gather(*big, small)
    return [r.status_code for r in answers]


@pytest.mark.parametrize("gated", [False, True], ids=["on the event loop", "on the worker thread"])
def test_a_small_request_is_not_queued_behind_every_large_body(gated):
    assert len(BIG) >= json_body.THREAD_DECODE_MIN_BYTES
    order: list[str] = []
    codes = asyncio.run(send_all(app_recording(order, gated)))
    assert codes == [200] * 7
    position = order.index("small")
    if gated:
        assert position <= 1, order  # at most the one body decoding when it came
    else:
        assert position == 6, order  # the baseline this module exists for: last, behind every body


def test_bad_json_is_refused_as_before_whatever_its_size():
    """A malformed large body reaches FastAPI's own JSON error, as a small one does."""
    async def send(content: bytes) -> httpx.Response:
        app = app_recording([], gated=True)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/score", content=content, headers={"content-type": "application/json"})

    for content in (b'{"id": ', BIG[:-1]):
        r = asyncio.run(send(content))
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == "json_invalid", r.text


# ---- over-long token arrays on the score route: refused by their length, never decoded ----------

VALIDATOR = Validator(Limits(max_sequence_length=8, vocab_size=1000, max_sequences_per_request=16))
IDS_LIMIT = INPUT_FACTOR * 8


def body_of(seqs: list, **extra) -> bytes:
    return json.dumps({"sequences": seqs, "truncation": "left", **extra}).encode()


def refusal(doc) -> str:
    """The message the route's model and the core's validator give `doc`, as the route would."""
    try:
        req = ScoreIn.model_validate(doc)
        VALIDATOR.request([s.seq_input() for s in req.sequences], req.truncation)
    except ScoreError as e:
        return e.message
    except ValidationError as e:
        return str(e.errors()[0]["loc"]) + e.errors()[0]["type"]
    return "accepted"


def test_an_over_long_array_is_not_decoded_and_gets_the_refusal_it_always_got():
    seqs = [{"tokens": [3] * 5}, {"tokens": list(range(100, 100 + IDS_LIMIT + 1))}]
    body = body_of(seqs)
    doc = json_body.decode(body, IDS_LIMIT)
    assert doc["sequences"][0]["tokens"] == [3] * 5
    assert isinstance(doc["sequences"][1]["tokens"], str)  # the marker: no int objects made
    assert len(ScoreIn.model_validate(doc).sequences[1].tokens) == IDS_LIMIT + 1
    assert refusal(doc) == refusal(json.loads(body))
    assert refusal(doc).startswith(f"sequences[1].tokens.ids: length {IDS_LIMIT + 1} exceeds {IDS_LIMIT}")
    many = body_of([{"tokens": list(range(70_000))}])  # counted in several pieces
    assert len(many) > 4 * json_body._PIECE_BYTES
    assert len(ScoreIn.model_validate(json_body.decode(many, IDS_LIMIT)).sequences[0].tokens) == 70_000


def test_arrays_within_the_limit_or_not_flat_decode_as_json_does():
    n = IDS_LIMIT + 1
    cases = [
        body_of([{"tokens": [7] * IDS_LIMIT}]),  # at the limit: validated as ever
        body_of([{"tokens": [7.0] * n}]), body_of([{"tokens": [7] * (n - 1) + ["7"]}]),
        body_of([{"tokens": [[7]] * n}]), body_of([{"tokens": [7] * (n - 1) + [True]}]),
        body_of([{"tokens": [7] * n}]).replace(b"7, 7", b"07, 7", 1),  # not JSON: json's own error below
        # a trailing comma just where a piece ends (json_body._PIECE_BYTES), and one anywhere
        b'{"sequences": [{"tokens": [' + b"7," * n + b"1" + b" " * json_body._PIECE_BYTES + b",]}]}",
        body_of([{"tokens": [7] * n}]).replace(b"]", b", ]", 1),
        # "tokens" inside strings: a quote in a string is escaped, so none of these is a key
        body_of([{"prompt": ', "tokens": [' + "1," * n + "1]", "response": "x"}]),
        body_of([{"prompt": '{"tokens":[' + "1," * n + "1]}", "response": "x"}]),
        # a key named "tokens" elsewhere: decoded as it is, refused by the model as before
        body_of([{"tokens": [1]}], extra={"tokens": [1] * n}),
    ]
    flat_over_long = (cases[1], cases[4])  # numbers and constants: counted, refused by their length
    for body in cases:
        if json_body.without_over_long_ids(body, IDS_LIMIT) is not None:
            # replaced only where the array is flat, or where the model refuses the key anyway
            assert body in (*flat_over_long, cases[-1]), body[:80]
            got = refusal(json_body.decode(body, IDS_LIMIT))
            assert got.startswith(f"sequences[0].tokens.ids: length {n} exceeds") if body in flat_over_long \
                else got == refusal(json.loads(body)), got
            continue
        try:
            expected = json.loads(body)
        except ValueError as e:
            with pytest.raises(type(e), match=re.escape(str(e))):
                json_body.decode(body, IDS_LIMIT)
            continue
        assert json_body.decode(body, IDS_LIMIT) == expected


def test_a_malformed_body_gets_json_errors_own_message_and_character():
    body = body_of([{"tokens": [7] * (IDS_LIMIT + 1)}])[:-1] + b"x}"  # broken after the array
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(body)
    with pytest.raises(json.JSONDecodeError) as got:
        json_body.decode(body, IDS_LIMIT)
    assert (got.value.msg, got.value.pos) == (want.value.msg, want.value.pos)


def test_a_client_cannot_send_the_marker():
    """Only this process knows the marker's random part: a guessed one is a string where ids belong."""
    forged = "rmscore-over-long-ids-" + "0" * 32 + ":5"
    assert refusal({"sequences": [{"tokens": forged}]}) == refusal({"sequences": [{"tokens": "x"}]})
    assert "list_type" in refusal({"sequences": [{"tokens": forged}]})


def test_no_spelling_of_the_key_lets_an_over_long_array_decode():
    """Whitespace before the key, at any length, is still found; a key with an escaped letter, or a body
    in UTF-16, is refused with a message saying so (json.loads reads both as the same key, and decoded
    whole such an array kept py-http 95 MB over its baseline)."""
    over = "[" + ",".join(["7"] * (IDS_LIMIT + 1)) + "]"
    for gap in (" " * 65, "\n\t " * 3000):
        body = ('{"sequences": [{' + gap + '"tokens": ' + over + '}], "truncation": "left"}').encode()
        doc = json_body.decode(body, IDS_LIMIT)
        assert isinstance(doc["sequences"][0]["tokens"], str), gap[:4]  # the marker
        assert refusal(doc) == refusal(json.loads(body))
    for key in ("\\u0074okens", "t\\u006Fkens", "token\\u0073"):
        body = ('{"sequences": [{"' + key + '": ' + over + '}], "truncation": "left"}').encode()
        assert len(json.loads(body)["sequences"][0]["tokens"]) == IDS_LIMIT + 1  # the same key to json
        with pytest.raises(json.JSONDecodeError, match="escapes an ASCII letter") as e:
            json_body.decode(body, IDS_LIMIT)
        assert body[e.value.pos:e.value.pos + 2] == b"\\u"
    utf16 = body_of([{"tokens": [7] * (IDS_LIMIT + 1)}]).decode().encode("utf-16")
    with pytest.raises(json.JSONDecodeError, match="must be UTF-8"):
        json_body.decode(utf16, IDS_LIMIT)
    # An escaped backslash before "u0074" is text, not an escape: the over-long array is still found
    # (the marker), and the text is kept as json.loads reads it. A BOM is read past.
    text = {"prompt": "\\u0074 \\\\u0074", "response": "x"}
    body = body_of([{"tokens": [7] * (IDS_LIMIT + 1)}, text])
    assert b'\\\\u0074' in body
    for b in (body, b"\xef\xbb\xbf" + body):
        doc = json_body.decode(b, IDS_LIMIT)
        assert isinstance(doc["sequences"][0]["tokens"], str) and doc["sequences"][1] == text, b[:60]
    # Where no array can be over the limit (fewer commas than it), an escaped letter or UTF-16 decodes
    # as json.loads does.
    for b in (body_of([{"tokens": [7] * 3}, {"prompt": "t", "response": "x"}]).replace(b'"t"', b'"\\u0074"'),
              body_of([{"tokens": [7] * 3}]).decode().encode("utf-16")):
        assert json_body.decode(b, IDS_LIMIT) == json.loads(b), b[:60]


def test_a_flat_over_long_array_is_not_decoded_whatever_its_values():
    """One fraction, true or null among a million ids decoded them all before (the check wanted integers
    only). A flat array of any numbers and constants over the limit is counted in pieces and refused by
    its length; an array holding a string or a nested value is decoded, as json.loads does."""
    n = IDS_LIMIT + 1
    for tail in ("1.5", "true", "null", "-2e3"):
        body = ('{"sequences": [{"tokens": [' + "7," * n + tail + ']}], "truncation": "left"}').encode()
        doc = json_body.decode(body, IDS_LIMIT)
        assert isinstance(doc["sequences"][0]["tokens"], str), tail
        assert refusal(doc).startswith(f"sequences[0].tokens.ids: length {n + 1} exceeds {IDS_LIMIT}"), refusal(doc)
    for tail in ('"x"', "[1]", '{"a": 1}'):
        body = ('{"sequences": [{"tokens": [' + "7," * n + tail + ']}], "truncation": "left"}').encode()
        assert json_body.decode(body, IDS_LIMIT) == json.loads(body), tail


class _CountedBytes(bytes):
    """A body that counts the bytes its searches and slices pass over: work, not wall time."""

    passed = 0

    def find(self, sub, start=0, end=None):
        found = super().find(sub, start, end)
        stop = len(self) if end is None else min(end, len(self))
        _CountedBytes.passed += (found + len(sub) if found >= 0 else stop) - start
        return found

    def count(self, sub, start=0, end=None):
        _CountedBytes.passed += (len(self) if end is None else min(end, len(self))) - start
        return super().count(sub, start, end)

    def __getitem__(self, key):
        got = super().__getitem__(key)
        if isinstance(key, slice):
            _CountedBytes.passed += len(got)
        return got


def test_the_search_for_over_long_arrays_is_linear_in_the_body():
    """Each key opening an array scanned on to the next "]": 16k such keys took 2.2 s, 32k about 9 s,
    holding the GIL behind the one-decode gate. Found once, the "]" is kept for every key before it.
    Counted in bytes passed over, not in seconds: the quadratic search passed over the body about
    16,000 times; the linear one passes over it 1-8 times (each key looks back 64 bytes)."""
    for closed in (b"", b"]"):
        body = _CountedBytes(b'{"a":[' + b',"tokens":[' * 32_768 + closed)
        _CountedBytes.passed = 0
        assert json_body.without_over_long_ids(body, 1000) is None
        assert _CountedBytes.passed < 64 * len(body), (closed, _CountedBytes.passed / len(body))


def test_an_integer_is_placed_by_characters_and_never_in_a_string():
    """The too-long integer's place is where json's errors put theirs, in characters, and a run of
    digits inside a string is text, not the integer."""
    most = json_body.MOST_INT_DIGITS
    head = '{"note": "\u00e9' + "9" * (most + 50) + '", "tokens": [1, '
    body = (head + "7" * (most + 1) + "]}").encode()
    with pytest.raises(json.JSONDecodeError) as e:
        json_body.decode(body)
    assert e.value.pos == len(head) and e.value.msg == f"an integer of {most + 1} digits; at most {most} are read"


def test_the_gate_is_held_until_the_decoding_thread_ends(monkeypatch):
    """A client gone mid-decode cancels its handler; its body goes on decoding on the worker thread,
    so the next large body must still wait for it (one decoding at a time)."""
    started, release = threading.Event(), threading.Event()

    def slow_decode(body, limit):
        started.set()
        release.wait(10)
        return {"id": "late"}

    monkeypatch.setattr(json_body, "decode", slow_decode)

    async def go():
        gated = type("Gated", (json_body._ThreadDecodedRequest,), {"gate": asyncio.Semaphore(1)})
        request = gated({"type": "http", "method": "POST", "headers": []})
        request._body = b" " * json_body.THREAD_DECODE_MIN_BYTES
        waiting = asyncio.create_task(request.json())
        await asyncio.to_thread(started.wait, 10)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert gated.gate.locked(), "the gate was given back while the thread still decodes"
        release.set()
        for _ in range(500):
            if not gated.gate.locked():
                break
            await asyncio.sleep(0.01)
        assert not gated.gate.locked(), "the gate was not given back when the thread ended"

    asyncio.run(go())


def test_an_integer_of_too_many_digits_is_placed_and_explained():
    """No field takes an integer past int64's 19 digits. Python converts up to 4300 by default, in time
    quadratic in the digits (a 16 MiB body of them held the GIL 0.4 s), and refused a longer one with a
    bare ValueError that FastAPI answered "There was an error parsing the body", with no place. Now
    an app's routes read at most 640 (Python's least limit) and place the refusal, in small and large
    bodies alike; the same digits in a string are text."""
    async def send(content: bytes) -> httpx.Response:
        app = app_recording([], gated=True)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/score", content=content, headers={"content-type": "application/json"})

    most = json_body.MOST_INT_DIGITS
    for digits in (b"7" * (most + 1), b"-" + b"7" * 5000):
        for pad in (b"", b" " * json_body.THREAD_DECODE_MIN_BYTES):
            body = b'{"id": "x", "note": "a' + b"9" * 30 + b'",' + pad + b' "tokens": [[1, ' + digits + b"]]}"
            r = asyncio.run(send(body))
            assert r.status_code == 422, r.text
            detail = r.json()["detail"][0]
            assert detail["type"] == "json_invalid" and detail["loc"] == ["body", body.index(digits.lstrip(b"-"))], detail
            n = len(digits.lstrip(b"-"))
            assert detail["ctx"]["error"] == f"an integer of {n} digits; at most {most} are read", detail
    assert sys.get_int_max_str_digits() == most
    fine = b'{"id": "x", "note": "' + b"9" * 2 * most + b'", "tokens": [[1, ' + b"7" * most + b"]]}"
    assert json_body.decode(fine) == json.loads(fine)


def test_no_collection_runs_while_a_body_decodes():
    """Each collection during json.loads walked every list made so far: 14 MiB of empty arrays took 2.1 s
    holding the GIL, 0.28 s without collections. None runs during a decode, and the collector is on after."""
    runs: list[int] = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    body = b'{"sequences": [' + b"[]," * 200_000 + b"[]]}"
    gc.callbacks.append(count)
    try:
        doc = json_body.decode(body)
    finally:
        gc.callbacks.remove(count)
    assert len(doc["sequences"]) == 200_001
    assert runs == [] and gc.isenabled(), runs
