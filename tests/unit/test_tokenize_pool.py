"""core/tokenizing.py and the text paths built on it (issue 29, defect 3), without a server:
the character cap refuses before tokenizing, encoding leaves the GIL free, the pool counts its
work in admission, and a cancelled caller's pieces stop."""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time

import pytest

from rmscore.core.errors import Code, ScoreError
from rmscore.core.tokenizing import TokenizePool, default_max_text_chars, pieces
from rmscore.core.validation import Limits, SeqInput, Validator
from rmscore.frontends.reward_text import Encoder
from references import released

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_JSON = (ROOT / "models" / "default" / "tokenizer.json").read_text()


def tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(TOKENIZER_JSON)
    tok.no_padding()
    tok.no_truncation()
    return tok


def test_text_over_the_cap_is_refused_before_tokenizing():
    class Untouchable:
        def encode_batch(self, *a, **k):
            raise AssertionError("tokenized a text over the cap")

    v = Validator(Limits(512, 30522, 8, 1000), Untouchable())
    with pytest.raises(ScoreError) as e:
        v.check_request([SeqInput(text=("why?", "x" * 1001))], "none")
    assert e.value.code == Code.INVALID_ARGUMENT
    assert e.value.message.startswith("sequences[0].text.response: 1001 characters exceed max_text_chars 1000")
    enc = Encoder(TOKENIZER_JSON, 512, max_chars=100)
    for call in (lambda: enc.encode([("q", "y" * 101)]), lambda: enc.plain.encode("y" * 101)):
        with pytest.raises(ScoreError, match="101 characters exceed max_text_chars 100"):
            call()
    assert default_max_text_chars(512) == 131072


def test_batch_encoding_gives_the_ids_encode_gave():
    tok = tokenizer()
    v = Validator(Limits(512, 30522, 8, 1 << 20), tok)
    assert v.request([SeqInput(text=("why?", "because.")), SeqInput(text=("", "alone"))], "none") == \
        [tok.encode("why?", "because.").ids, tok.encode("", "alone").ids]
    enc = Encoder(TOKENIZER_JSON, 16)
    assert enc.encode([("q", "a"), "hi"]) == [tok.encode("q", "a").ids, tok.encode("hi").ids]
    assert enc.encode_one("hi", add_special_tokens=False) == tok.encode("hi", add_special_tokens=False).ids
    # A pair still loses the start of its prompt first.
    cut = enc.encode_one(("word " * 40, "end"))
    assert len(cut) == 16 and cut[:1] == tok.encode("x").ids[:1] and cut[-2:] == tok.encode("x", "end").ids[-2:]


def worst_gap_while(work) -> float:
    """The longest another thread waited for the GIL (its 1 ms sleeps) while `work` ran on a thread."""
    gaps, stop = [0.0], threading.Event()

    def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps[0], last = max(gaps[0], now - last), now

    t = threading.Thread(target=ticker)
    t.start()
    try:
        work()
    finally:
        stop.set()
        t.join()
    return gaps[0]


def test_tokenizing_leaves_the_gil_to_the_event_loop():
    # Tokenizer.encode held the GIL for the whole text (~280 ms for these 540,000 characters here);
    # encode_batch releases it. The bound is loose for a shared machine, and far under the old gap.
    text = "hello world, this is text. " * 20000
    v = Validator(Limits(512, 30522, 8, 1 << 20), tokenizer())
    enc = Encoder(TOKENIZER_JSON, 512, max_chars=1 << 20)
    assert worst_gap_while(lambda: v.request([SeqInput(text=(text, "x"))], "left")) < 0.15
    assert worst_gap_while(lambda: enc.encode([(text, "x")])) < 0.15


def test_pieces_group_texts_up_to_the_limit():
    assert pieces([10, 10, 300000, 5, 5], 20) == [range(0, 2), range(2, 3), range(3, 5)]
    assert pieces([], 20) == []


def test_a_cancelled_caller_stops_between_pieces_and_is_released():
    ran = []

    def slow(k):
        time.sleep(0.2)
        ran.append(k)
        return [k]

    async def main():
        pool = TokenizePool(60.0, threads=1)
        assert await pool.run([(lambda: [1], 1), (lambda: [2], 1)], None) == [1, 2]
        first = asyncio.ensure_future(pool.run([(lambda k=k: slow(k), 10) for k in range(5)], None))
        queued = asyncio.ensure_future(pool.run([(lambda: slow("never"), 10)], None))  # waits for the thread
        await asyncio.sleep(0.1)
        first.cancel()
        queued.cancel()
        await asyncio.gather(first, queued, return_exceptions=True)
        await asyncio.sleep(0.4)
        return pool

    pool = asyncio.run(main())
    assert ran == [0], ran  # the running piece ends; no other starts
    assert pool.wait_s() == 0  # every character is released


def test_tokenizing_ahead_counts_in_admission():
    async def main():
        pool = TokenizePool(1.0, threads=1)
        pool.s_per_char = 1e-3  # 1000 characters: a second
        gate = threading.Event()
        busy = asyncio.ensure_future(pool.run([(lambda: gate.wait(5) and [], 900)], None))
        await asyncio.sleep(0.05)
        with pytest.raises(ScoreError) as full:
            await pool.run([(lambda: [], 200)], None)
        with pytest.raises(ScoreError) as late:
            await pool.run([(lambda: [], 50)], time.monotonic() + 0.5)
        gate.set()
        await busy
        # Idle, any size the caps let through is taken: its own work alone is not refused.
        assert await pool.run([(lambda: ["ok"], 5000)], None) == ["ok"]
        return full.value, late.value

    full, late = asyncio.run(main())
    assert full.code == Code.RESOURCE_EXHAUSTED and "of tokenizing waiting exceeds max_queue_wait_seconds" \
        in full.message, full.message
    assert late.code == Code.DEADLINE_EXCEEDED, late.message


def test_encode_counted_keeps_order_and_passes_ids_through():
    from rmscore.frontends.reward_text import encode_counted

    tok = tokenizer()
    enc = Encoder(TOKENIZER_JSON, 512, max_chars=100)
    pool = TokenizePool(60.0)
    items = [("q", "a"), [101, 7, 102], "hi"]
    assert asyncio.run(encode_counted(pool, enc, items)) == \
        [tok.encode("q", "a").ids, [101, 7, 102], tok.encode("hi").ids]
    with pytest.raises(ScoreError, match="101 characters exceed max_text_chars 100"):
        asyncio.run(encode_counted(pool, enc, ["ok", "y" * 101]))
    assert pool.wait_s() == 0


def test_callers_take_turns_piece_by_piece():
    """A small request waits for the piece running now, not for a large one's whole text (issue 29:
    six large requests held the shared pool and a normal one took 22.6 s)."""
    order = []

    def piece(name):
        time.sleep(0.05)
        order.append(name)
        return [name]

    async def main():
        pool = TokenizePool(60.0, threads=1)
        big = asyncio.ensure_future(pool.run([(lambda k=k: piece(f"big{k}"), 10) for k in range(6)], None))
        await asyncio.sleep(0.01)
        small = await pool.run([(lambda: piece("small"), 10)], None)
        assert await big == [f"big{k}" for k in range(6)]
        # A failing piece reaches its caller, and nothing of its request stays counted.
        with pytest.raises(ScoreError, match="bad text"):
            await pool.run([(lambda: (_ for _ in ()).throw(ScoreError(Code.INVALID_ARGUMENT, "bad text")), 10),
                            (lambda: piece("after the error"), 10)], None)
        return pool, small

    pool, small = asyncio.run(main())
    assert small == ["small"] and order.index("small") <= 2, order
    assert "after the error" not in order and pool.wait_s() == 0


def test_an_idle_pool_holds_nothing_of_the_last_job():
    # An idle worker thread kept its last piece's result (and through the job every piece's) until the
    # next job came: 4 abandoned 1024-pair /score requests stayed resident on an idle py-http server.
    class Token:
        pass

    import weakref

    async def main():
        pool = TokenizePool(60.0, threads=1)
        out = await pool.run([(lambda: [Token()], 1), (lambda: [Token()], 1)], None)
        refs = [weakref.ref(t) for t in out]
        del out
        return pool, refs

    pool, refs = asyncio.run(main())
    assert all(released(r) for r in refs)
    pool.shutdown()


def test_token_ids_share_one_int_object_per_id():
    # Each request's ids are the shared objects, not new ints kept alive for the request's lifetime in
    # Python's small-object arenas (core/tokenizing.py, shared_ids).
    from rmscore.core.tokenizing import encode_ids, shared_ids

    tok = tokenizer()
    a, b = encode_ids(tok, ["the same words here", "the same words here"])
    assert a == tok.encode("the same words here").ids
    assert all(x is y for x, y in zip(a, b))
    big = int("40000")  # past the default vocabulary: the table grows to it
    out = shared_ids([5, big, 7])
    assert out == [5, 40000, 7] and out[1] is not big and shared_ids([big])[0] is out[1]
