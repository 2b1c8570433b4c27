"""The text pairs of vLLM's /score and /rerank, counted and tokenized at the cost of their distinct texts.

One query against N documents used to be tokenized N times (Encoder.encode_one per pair): a 128 KiB
body cost 9.4 CPU-s (issue 29). Here each distinct text is tokenized once, without special tokens,
and each pair's ids are those ids inside the special tokens the tokenizer's post-processor puts
around a pair (pair_layout), which are the ids `Encoder.encode_one((a, b))` gives
(tests/unit/test_vllm_pairs.py holds them equal), cuts included: a pair longer than the model loses
the start of its first text, or, when the second text alone is too long, keeps its last max_len
tokens. (Assembling tokenizers Encodings instead was no cheaper: a cut Encoding keeps what it cut as
`overflowing`, and post_process builds every combination of those: 5 ms a pair for a 30k-token query.)
"""

from __future__ import annotations

import functools

from rmscore.core.errors import invalid
from rmscore.core.tokenizing import shared_ids
from rmscore.core.validation import check_unicode
from rmscore.frontends.reward_text import Encoder


def broadcast(first: list[str], second: list[str], most: int,
              names: tuple[str, str] = ("text_1", "text_2")) -> list[tuple[str, str]]:
    """vLLM's pairing (1:1, 1:N or N:N), refused before any tokenizing when empty, mismatched, or
    more than `most` pairs (max_sequences_per_request: a pair is one sequence for the model, and a
    one-text body of N pairs costs N model sequences however short its bytes)."""
    one, two = names
    if not first or not second:
        raise invalid(f"{one}/{two}: empty input")
    if len(first) > 1 and len(first) != len(second):
        raise invalid(f"{one}/{two}: {len(first)} first texts for {len(second)} second texts; send one "
                      "first text or as many as second texts")
    if len(second) > most:
        raise invalid(f"{two}: {len(second)} pairs exceed max_sequences_per_request {most}; send at most "
                      f"{most} per request")
    if len(first) == 1:
        first = first * len(second)
    return list(zip(first, second))


def encode_pairs(encoder: Encoder, pairs: list[tuple[str, str]], first_max: int = 0, second_max: int = 0,
                 names: tuple[str, str] = ("text_1", "text_2")) -> list[list[int]]:
    """The ids of each (first, second) pair, strings stripped (--strip-string), each first text cut
    to its first `first_max` tokens and each second to its first `second_max` (0: no cut), as vLLM's
    max_tokens_per_query / max_tokens_per_doc. Every text is checked (Unicode, --max-text-chars)
    before any is tokenized, and errors name the field (`names`) and the pair's index. A text is
    tokenized once however many pairs hold it. With --chat-template, or a post-processor that is not
    special tokens around the two texts, a pair is encoded as one text, so each distinct pair is
    tokenized once instead (the pair count is bounded by `broadcast`). With --chat-template a pair is
    rendered as vLLM renders score pairs with a chat template (CrossEncoderIOProcessor.get_score_prompt,
    vllm/entrypoints/pooling/scoring/io_processor.py at c2dbc3c5): messages
    [{"role": "query", "content": first}, {"role": "document", "content": second}], no generation
    prompt, then the text tokenized with the tokenizer's special tokens added (TokenizeParams'
    add_special_tokens defaults to true there), not as /get_reward's user and assistant turns."""
    stripped: dict[str, str] = {}
    for i, pair in enumerate(pairs):
        for name, text in zip(names, pair):
            if text not in stripped:
                encoder.check(text, f"{name}[{i}]")  # its length first: nothing of it read
                check_unicode(text, f"{name}[{i}]")
                stripped[text] = encoder.strip(text)
        if pair == ("", ""):
            raise invalid(f"{names[0]}/{names[1]}[{i}]: empty pair")
    layout = _layout(encoder)
    if layout is None:
        return _whole_pairs(encoder, pairs, stripped, first_max, second_max)
    prefix, middle, suffix = layout
    tok, most = encoder.plain, encoder.max_len
    ids_of: dict[tuple[str, int], list[int]] = {}

    def ids(text: str, keep: int) -> list[int]:
        key = (text, keep)
        if key not in ids_of:
            x = shared_ids(tok.encode(stripped[text], add_special_tokens=False).ids)
            if keep:
                x = x[:keep]
            # Only a text's last max_len tokens can be in a pair's ids (a long pair is cut from the
            # left), so no more are kept: each pair below copies at most that many.
            ids_of[key] = x[-most:]
        return ids_of[key]

    specials = len(prefix) + len(middle) + len(suffix)
    out = []
    for a, b in pairs:
        xa, xb = ids(a, first_max), ids(b, second_max)
        over = len(xa) + len(xb) + specials - most
        if 0 < over < len(xa):  # the first text loses its start (the tokenizer's only_first, left)
            xa = xa[over:]
        x = prefix + xa + middle + xb + suffix
        out.append(x[-most:] if len(x) > most else x)
    return out


def tokenized_chars(encoder: Encoder, pairs: list[tuple[str, str]]) -> int:
    """The characters `encode_pairs` tokenizes for `pairs`, what admission counts: each distinct text
    once, or, where pairs are encoded whole (--chat-template, a post-processor `pair_layout` cannot
    read), each distinct pair's two texts. Counting distinct texts there, a 130 KB query with 64
    documents was admitted as 130k characters and tokenized 64 times (10.8 s, unstoppable), and a
    probe behind two such requests waited 11.5 s."""
    if _layout(encoder) is not None:
        return sum(map(len, {t for pair in pairs for t in pair}))
    return sum(len(a) + len(b) for a, b in set(pairs))


def _layout(encoder: Encoder) -> tuple[list[int], list[int], list[int]] | None:
    """The layout `encode_pairs` puts texts in, None where it encodes pairs whole (--chat-template)."""
    return None if encoder.template is not None else _cached_layout(encoder.plain)


@functools.lru_cache(maxsize=16)
def _cached_layout(tok) -> tuple[list[int], list[int], list[int]] | None:
    """`pair_layout` once per tokenizer (40 us, asked twice a /score request, once on the event loop)."""
    return pair_layout(tok)


def pair_layout(tok) -> tuple[list[int], list[int], list[int]] | None:
    """The special ids the tokenizer's post-processor puts before, between and after a pair's two
    texts ([CLS] / [SEP] / [SEP] for BERT, <s> / </s></s> / </s> for RoBERTa), found by post-processing
    two probe texts both ways round; None when its output is not that (then pairs are encoded whole)."""
    a = tok.encode("first probe text", add_special_tokens=False)
    b = tok.encode("second", add_special_tokens=False)
    if not a.ids or not b.ids or a.ids == b.ids:
        return None
    out = tok.post_process(a, b, add_special_tokens=True).ids
    n = tok.num_special_tokens_to_add(True)
    if len(out) != len(a.ids) + len(b.ids) + n:
        return None
    for i in range(n + 1):
        for m in range(n + 1 - i):
            j = i + len(a.ids) + m
            if out[i:i + len(a.ids)] == a.ids and out[j:j + len(b.ids)] == b.ids:
                layout = out[:i], out[i + len(a.ids):j], out[j + len(b.ids):]
                # The other way round too: the specials must not depend on the texts.
                if tok.post_process(b, a, add_special_tokens=True).ids == layout[0] + b.ids + layout[1] + a.ids + layout[2]:
                    return layout
    return None


def _whole_pairs(encoder: Encoder, pairs, stripped, first_max: int, second_max: int) -> list[list[int]]:
    def head(text: str, keep: int) -> str:
        """The text up to the end of its `keep`-th token (vLLM's truncate_text_to_tokens)."""
        if not keep:
            return text
        offsets = encoder.plain.encode(text, add_special_tokens=False).offsets
        return text if len(offsets) <= keep else text[:offsets[keep - 1][1]]

    heads: dict[tuple[str, int], str] = {}
    done: dict[tuple[str, str], list[int]] = {}
    out = []
    for a, b in pairs:
        if (a, b) not in done:
            for t, k in ((a, first_max), (b, second_max)):
                if (t, k) not in heads:
                    heads[(t, k)] = head(stripped[t], k)
            ha, hb = heads[(a, first_max)], heads[(b, second_max)]
            if encoder.template is not None:  # vLLM's rendering of a score pair, special tokens added
                done[(a, b)] = encoder.encode_one(encoder.render_score_pair(ha, hb), add_special_tokens=True)
            else:
                done[(a, b)] = encoder.encode_one((ha, hb))
        out.append(done[(a, b)])
    return out
