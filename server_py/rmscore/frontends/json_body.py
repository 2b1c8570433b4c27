"""Large JSON bodies are decoded on a worker thread, one at a time, not on the event loop.

`json.loads` holds the GIL for the whole body: about 14 ms for a 128 x 512-token request (430 KB)
here. FastAPI decodes a body on the event loop, so when eight clients sent such bodies back to back
a one-sequence request queued behind their decoding and its answer (a refusal that was itself immediate) took
100-250 ms (the work flood: docs/hardening.md, "A queue bounded by work"). On one worker thread a big body
still holds the GIL while it decodes, but only one at a time, and the event loop runs between them, so a small
request waits for at most one decoding, not for all of them.

The hook is FastAPI's own (a custom `APIRoute` whose `Request.json()` is replaced): FastAPI still
decides when a body is JSON and maps a decoding error (`json.JSONDecodeError`, `RecursionError`,
`UnicodeDecodeError` are raised from the thread unchanged) exactly as before.

On the score route, a `"tokens"` array of more ids than any sequence may send (64 x the model's
maximum, docs/contract.md) is not decoded: it is refused whatever it holds, and decoding it made a
million int objects. Python's allocator gives their 1 MiB arenas back only once every object in them
is freed, and objects made meanwhile pinned them: py-http stayed 6-18% over its baseline after a
flood of refused 1M-id bodies (docs/bench/attacks_2026-12-07/). `without_over_long_ids` puts in its
place a string that only this process can write, holding the array's length, and the request model
turns it into `OverLongIds`, whose length the validator refuses with the message it always gave.
The search reads bytes, so a body that could hold such an array must spell its keys as bytes: UTF-8,
no letter of "tokens" escaped (`_check_spelling`; an escaped key kept py-http 95 MB over its baseline).
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import secrets
import sys
from typing import Any, Callable, Coroutine

from fastapi import Request, Response
from fastapi.routing import APIRoute

#: Bodies up to this many bytes decode on the event loop (well under a millisecond); larger ones on
#: the worker thread, whose hand-off costs about 0.1 ms.
THREAD_DECODE_MIN_BYTES = 64 << 10


#: Starts the string that stands for an over-long array: random per process, so no client can send one.
OVER_LONG_MARKER = "rmscore-over-long-ids-" + secrets.token_hex(16) + ":"

# A key "tokens" opening an array: found with bytes.find, not a regex scan (that cost 200 ms on a 7 MB
# body, holding the GIL). After `{` or `,`, and with unescaped quotes, it cannot be inside a string: a
# quote in a string is escaped, so a match is a key of an object (or the body is malformed, and then
# `decode` answers the original body's own error).
_KEY = b'"tokens"'
_KEY_TO_ARRAY = re.compile(rb'"tokens"[ \t\n\r]*:[ \t\n\r]*\[')
_WHITESPACE = b" \t\n\r"
#: How far back from the key to look for the `{` or `,` before it; past that, the body decodes as ever.
_LOOK_BACK_BYTES = 64
#: An over-long array is checked in pieces of about this many bytes, each decoded by `json` itself and
#: dropped: exact JSON, no million objects alive at once, and the GIL free between pieces.
_PIECE_BYTES = 64 << 10


#: What a flat array of numbers, true, false and null is made of: its tail before a "]" is sought by
#: stripping these (no quote, bracket or brace: a string or a nested value is not ours to count).
_SCALAR_BYTES = b"0123456789,-+.eE" + b"truefalsn" + _WHITESPACE


def _scalar_count(span: bytes) -> int | None:
    """How many values `span` (an array's inside, made of _SCALAR_BYTES) holds when it is valid JSON;
    None when it is not (a trailing comma, `1..2`, `tru`...)."""
    n, at = 0, 0
    while True:
        cut = span.find(b",", at + _PIECE_BYTES)
        try:
            piece = json.loads(b"[" + (span[at:] if cut < 0 else span[at:cut]) + b"]")
        except ValueError:
            return None
        if not piece:  # a trailing comma where a piece ends
            return None
        n += len(piece)
        if cut < 0:
            return n
        at = cut + 1


def _run_start(body: bytes, lo: int, end: int, run_of: bytes) -> int:
    """Where the run of `run_of` bytes that ends at `end` starts (not before `lo`): looked for in
    windows that double, so the cost is C-speed passes over that run's length."""
    size = _LOOK_BACK_BYTES
    while True:
        start = max(lo, end - size)
        kept = body[start:end].rstrip(run_of)
        if kept or start == lo:
            return start + len(kept)
        size *= 2


class OverLongIds:
    """A token-id array of `length` ids, over what any sequence may send: its length, not its ids."""

    __slots__ = ("length",)

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    @classmethod
    def parse(cls, value: Any) -> "OverLongIds | None":
        """The array a marker string stands for; None for any other value."""
        if isinstance(value, str) and value.startswith(OVER_LONG_MARKER):
            return cls(int(value[len(OVER_LONG_MARKER):]))
        return None


def _byte_before(body: bytes, at: int) -> bytes:
    """The last byte before `at` that is not JSON whitespace (b"" when none)."""
    start = _run_start(body, 0, at, _WHITESPACE)
    return body[start - 1:start] if start else b""


#: `\u` escapes of the letters of "tokens" (hex digits in either case). No JSON encoder escapes an
#: ASCII letter, and a key spelled with one is the same key to `json.loads` but not to the byte search.
_ESCAPED_KEY_LETTERS = tuple(b"\\u%04x" % ord(c) for c in "tokens") + \
    tuple(b"\\u%04X" % ord(c) for c in "tokens" if (b"%04x" % ord(c)) != (b"%04X" % ord(c)))


#: How many escape-like texts (`\\u0074`) a large body may hold before it is refused all the same.
_MOST_LITERAL_ESCAPES = 1000


def _check_spelling(body: bytes) -> None:
    """Refuse a body the byte search cannot read as `json.loads` would: one not in UTF-8 (RFC 8259
    8.1 requires it between systems; `json.loads` also takes UTF-16 and UTF-32) or one escaping a
    letter of "tokens". Either would let an over-long array be decoded whole."""
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):  # a BOM the byte search reads past
        raise json.JSONDecodeError("a body this large must be UTF-8 (RFC 8259, section 8.1)", "", 0)
    if b"\\" not in body:  # memchr: most bodies have no escape at all (9 searches cost 28 ms on 3.6 MB)
        return
    looked = 0
    for escape in _ESCAPED_KEY_LETTERS:
        at = body.find(escape)
        while at >= 0:
            # After an escaped backslash (`\\u0074`) it is text, not an escape: the run of backslashes
            # ending at `at` is odd for an escape. Text like that is rare; past a bound it is refused too.
            run = body[max(0, at - 64):at + 1]
            looked += 1
            if (len(run) - len(run.rstrip(b"\\"))) % 2 or looked > _MOST_LITERAL_ESCAPES:
                raise json.JSONDecodeError(
                    f"{escape.decode()} escapes an ASCII letter; in a body this large, send letters as they are",
                    "", _character_at(body, at))
            at = body.find(escape, at + 1)


def without_over_long_ids(body: bytes, limit: int) -> bytes | None:
    """`body` with each flat `"tokens"` array (numbers, true, false, null) of more than `limit` values
    replaced by a marker string holding its length (`OverLongIds.parse`); None when it has none.
    Linear in the body: the "]" closing a key's array, and the flat run before it, are found once and
    kept for every later key before that "]" (a body of 16k keys opening arrays took 2.2 s before)."""
    parts, at, pos = [], 0, body.find(_KEY)
    end, flat = -1, -1  # the "]" after the last array opened, and where the flat run before it starts
    while pos >= 0:
        key, pos = pos, body.find(_KEY, pos + len(_KEY))
        m = _KEY_TO_ARRAY.match(body, key)
        if m is None or _byte_before(body, key) not in (b"{", b","):
            continue
        start = m.end()
        if start > end:
            end = body.find(b"]", start)
            if end < 0:
                break  # no later array closes either
            flat = _run_start(body, start, end, _SCALAR_BYTES)  # once for each "]"
        # Something else between the array's opening and the "]" (a string, a nested value): not flat.
        # The comma count next: cheap, so only arrays that long are read.
        if start < flat or body.count(b",", start, end) < limit:
            continue
        n = _scalar_count(body[start:end])
        if n is None or n <= limit:
            continue
        parts += [body[at:start - 1], b'"%s%d"' % (OVER_LONG_MARKER.encode(), n)]
        at = end + 1
        if pos >= 0 and pos < at:
            pos = body.find(_KEY, at)
    if not parts:
        return None
    parts.append(body[at:])
    return b"".join(parts)


def decode(body: bytes, ids_limit: int | None = None) -> Any:
    """`json.loads(body)`, with `"tokens"` arrays of more than `ids_limit` ids left undecoded
    (`without_over_long_ids`). A malformed body raises exactly what `json.loads` raises on it, but for
    an integer of more than MOST_INT_DIGITS digits, which gets a JSONDecodeError at its place."""
    try:
        # Fewer commas than the limit: no array in the body can be over it.
        if ids_limit is not None and body.count(b",") >= ids_limit:
            _check_spelling(body)
            lean = without_over_long_ids(body, ids_limit)
            if lean is not None:
                try:
                    return _loads(lean)
                except (ValueError, RecursionError) as e:
                    # Its own error, at its own character: the body as sent, read again without making
                    # its ids (they would be the million objects the marker spared).
                    _raise_as_sent(body, e)
        return _loads(body)
    except ValueError as e:
        if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
            raise
        raise _too_many_digits(body, e) from None


def _zero_unless_too_long(text: str) -> int:
    if len(text) - text.startswith("-") > sys.get_int_max_str_digits() > 0:
        int(text)  # raises the ValueError json.loads would
    return 0


def _raise_as_sent(body: bytes, lean_error: BaseException) -> None:
    """Raise what `json.loads(body)` raises, read with every integer as 0 (a shared object, so a
    million ids make no million objects); `lean_error` if, against expectation, it reads."""
    _loads(body, parse_int=_zero_unless_too_long)
    raise lean_error


def _loads(body: bytes, **hooks) -> Any:
    """`json.loads` with the garbage collector off: every list it makes is tracked, and each collection
    that the allocations trigger walks all those made so far, so a body of millions of small containers
    (`[[],[],...]`, 14 MiB) took 2.1-2.9 s holding the GIL, against 0.28-0.46 s without collections (a
    body of token ids that size: 0.22 s). Nothing it makes is garbage until the body is dropped, and
    it holds the GIL throughout, so no other thread allocates meanwhile; the collector is turned back
    on only if it was on (two decodes interleaved leave it on)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return json.loads(body, **hooks)
    finally:
        if was_on:
            gc.enable()


#: The most digits an integer in a body may have: Python's least limit on int(str)
#: (sys.set_int_max_str_digits), set by `route_class` for the whole process. No field takes more than
#: int64's 19, and the conversion is quadratic in the digits: at Python's default, 4300, a 16 MiB body
#: of such integers held the GIL 0.4 s; at 640 it costs 96 ms, less than a body of token ids that size.
MOST_INT_DIGITS = 640
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")


def _too_many_digits(body: bytes, error: ValueError) -> ValueError:
    """json.loads refuses an integer past the limit with a bare ValueError, which FastAPI answered
    "There was an error parsing the body", with no place: this places it at the first run of more
    digits than the limit that stands where a number does (after `[`, `,` or `:`, and a `-`; a run in
    a string is text) and says why. C passes, on this error's path only. Anything else is returned
    as it came."""
    most = sys.get_int_max_str_digits()
    digits = body.translate(_DIGITS_TO_ZERO)
    at = digits.find(b"0" * (most + 1)) if most else -1
    while at >= 0:
        n = len(digits) - at - len(digits[at:].lstrip(b"0"))
        sign = at - 1 if body[at - 1:at] == b"-" else at
        if _byte_before(body, sign) in (b"[", b",", b":"):
            return json.JSONDecodeError(f"an integer of {n} digits; at most {most} are read", "",
                                        _character_at(body, at))
        at = digits.find(b"0" * (most + 1), at + n)
    return error


def _character_at(body: bytes, at: int) -> int:
    """The character index of byte `at` of a UTF-8 body, as json's own errors count."""
    return len(body[:at].decode("utf-8", "replace"))


class _ThreadDecodedRequest(Request):
    """A request whose `json()` decodes a large body on a worker thread, behind `gate`; with
    `ids_limit`, over-long token arrays undecoded (`decode`)."""

    gate: asyncio.Semaphore
    ids_limit: int | None = None

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            # An array over the limit is at least 2 bytes per id: past 64 KiB wherever max_sequence_length
            # is 512 or more (the default model's), so only the thread checks. A shorter model's
            # over-long array may decode here, as before: under 64 KiB, too small to matter.
            if len(body) < THREAD_DECODE_MIN_BYTES:
                self._json = decode(body)
            else:
                self._json = await self._decode_behind_gate(body)
        return self._json

    async def _decode_behind_gate(self, body: bytes) -> Any:
        """`decode(body)` on a worker thread, one at a time: each holds the GIL while it decodes. The
        gate is given back when the thread ends, not when the caller stops waiting: a client gone
        mid-decode cancels its handler, and the next body must not start decoding beside it."""
        await self.gate.acquire()
        try:
            running = asyncio.get_running_loop().run_in_executor(None, decode, body, self.ids_limit)
        except BaseException:
            self.gate.release()
            raise

        def ended(f: asyncio.Future) -> None:
            self.gate.release()
            if not f.cancelled():
                f.exception()  # retrieved: a caller that went away does not want it logged

        running.add_done_callback(ended)
        return await asyncio.shield(running)


def route_class(ids_limits: dict[str, int] | None = None) -> type[APIRoute]:
    """An `APIRoute` for one app (`app.router.route_class = route_class()` before adding routes):
    its routes decode large JSON bodies on a worker thread, one at a time in the whole app.
    `ids_limits`: route path -> the most ids a `"tokens"` array may hold; longer ones stay undecoded.
    Integers of more than MOST_INT_DIGITS digits are refused as they are decoded, in this process."""
    gate = asyncio.Semaphore(1)  # bound to the server's loop on first use (Python >= 3.10)
    if not 0 < sys.get_int_max_str_digits() <= MOST_INT_DIGITS:
        sys.set_int_max_str_digits(MOST_INT_DIGITS)  # for the process: json.loads reads no other

    class GatedRequest(_ThreadDecodedRequest):
        pass

    GatedRequest.gate = gate

    class ThreadDecodedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            limit = (ids_limits or {}).get(self.path)
            request_class = GatedRequest if limit is None else \
                type("IdsLimitedRequest", (GatedRequest,), {"ids_limit": limit})

            async def handle(request: Request) -> Response:
                return await handler(request_class(request.scope, request.receive))
            return handle

    return ThreadDecodedRoute
