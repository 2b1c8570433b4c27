"""Request validation: transport-neutral sequences in, token-id lists out, or a ScoreError.

Messages follow docs/contract.md word for word; the C++ server writes the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rmscore.core.errors import invalid
from rmscore.core.tokenizing import check_chars, encode_ids

TRUNCATIONS = ("none", "left", "right")


@dataclass(frozen=True)
class SeqInput:
    """Exactly one of `tokens` / `text` is set on a valid input; neither means 'no input set'."""

    tokens: Sequence[int] | None = None
    text: tuple[str, str] | None = None


#: The most token ids one sequence may send, as a multiple of max_sequence_length: truncation keeps
#: max_sequence_length of them, and a longer input is refused before it is copied or queued, since a
#: request is held until answered while admission counts only the ids it runs (the same in
#: server_cpp/src/validation.h kInputFactor; docs/contract.md, "Input bounds").
INPUT_FACTOR = 64


@dataclass(frozen=True)
class Limits:
    max_sequence_length: int
    vocab_size: int
    max_sequences_per_request: int
    #: The most characters a prompt or a response may have (--max-text-chars): checked before tokenizing.
    max_text_chars: int = 1 << 62


class Validator:
    def __init__(self, limits: Limits, tokenizer=None):
        # `tokenizer`: a tokenizers.Tokenizer with padding and truncation off, or None (no text input).
        self.limits = limits
        self.tokenizer = tokenizer

    def request(self, items: Sequence[SeqInput], truncation: str) -> list[list[int]]:
        self.check_request(items, truncation)
        if any(it.text is not None for it in items):
            return self.texts(items, range(len(items)), truncation)
        return [self.sequence(it, truncation, f"sequences[{i}]") for i, it in enumerate(items)]

    def check_request(self, items: Sequence[SeqInput], truncation: str) -> None:
        """What can be refused from the request's shape and lengths alone, nothing read or tokenized:
        truncation, the count, mixed inputs, and each text against max_text_chars."""
        self.truncation(truncation)
        n = len(items)
        if n == 0:
            raise invalid("sequences: empty request, send at least one sequence")
        if n > self.limits.max_sequences_per_request:
            raise invalid(f"sequences: {n} sequences exceed max_sequences_per_request "
                          f"{self.limits.max_sequences_per_request}")
        kinds = {("tokens" if it.tokens is not None else "text" if it.text is not None else None) for it in items}
        if None not in kinds and len(kinds) > 1:
            first = next(i for i, it in enumerate(items) if (it.text is not None) != (items[0].text is not None))
            raise invalid(f"sequences[{first}]: mixes text and token ids in one request; "
                          "send all token ids or all text")
        for i, it in enumerate(items):
            self.check_text_chars(it, f"sequences[{i}]")

    def check_text_chars(self, item: SeqInput, where: str) -> None:
        if item.text is not None and self.tokenizer is not None:
            check_chars(item.text[0], self.limits.max_text_chars, f"{where}.text.prompt")
            check_chars(item.text[1], self.limits.max_text_chars, f"{where}.text.response")

    def texts(self, items: Sequence[SeqInput], indices: range, truncation: str, where: str | None = None) \
            -> list[list[int]]:
        """The ids of items[indices] (a piece of a request; `where`: the name of a lone item), text
        tokenized in one encode_batch, which releases the GIL (core/tokenizing.py)."""
        pairs, out = [], []
        for i in indices:
            it, at = items[i], where or f"sequences[{i}]"
            if it.tokens is not None or it.text is None:
                out.append(self.sequence(it, truncation, at))
                continue
            self._check_text(it.text, at)
            pairs.append((i, it.text))
            out.append(None)
        if pairs:
            ids = encode_ids(self.tokenizer, [t for _, t in pairs])
            slots = [k for k, x in enumerate(out) if x is None]
            for k, (i, _), one in zip(slots, pairs, ids):
                out[k] = self._fit(one, truncation, where or f"sequences[{i}]")
        return out

    @staticmethod
    def truncation(truncation) -> None:
        """A front end passes an unknown wire value through as it came (proto3 enums are open), never as "none"."""
        if truncation not in TRUNCATIONS:
            raise invalid(f"truncation: unknown value {truncation}; "
                          "send TRUNCATION_NONE, TRUNCATION_LEFT or TRUNCATION_RIGHT")

    def sequence(self, item: SeqInput, truncation: str, where: str) -> list[int]:
        self.truncation(truncation)
        if item.tokens is not None and item.text is not None:  # only JSON can say both; protobuf's oneof cannot
            raise invalid(f"{where}: sets both tokens and text; send one of them")
        if item.tokens is not None:
            ids = self._ids(item.tokens, where)
        elif item.text is not None:
            ids = self._tokenize(item.text, where)
        else:
            raise invalid(f"{where}: no input set, send tokens or text")
        return self._fit(ids, truncation, where)

    def check_sent_ids(self, n: int, where: str) -> None:
        """INVALID_ARGUMENT for a sequence of `n` token ids over INPUT_FACTOR windows, truncation or not:
        what a route that cuts ids itself (vLLM's truncate_prompt_tokens) checks before its cut."""
        m = self.limits.max_sequence_length
        if n > INPUT_FACTOR * m:
            raise invalid(f"{where}.tokens.ids: length {n} exceeds {INPUT_FACTOR * m}, the most a sequence "
                          f"may send even with truncation ({INPUT_FACTOR} x max_sequence_length {m}); cut it "
                          "before sending")

    def _ids(self, tokens: Sequence[int], where: str) -> list[int]:
        if len(tokens) == 0:
            raise invalid(f"{where}.tokens.ids: empty sequence")
        self.check_sent_ids(len(tokens), where)
        vocab = self.limits.vocab_size
        # One list first: a protobuf repeated field makes a new int object for every id on every
        # pass, so min, max and a copy over it cost three times one list. min and max are then C
        # loops over ints that exist (JSON integers have no bound): cheaper than a round trip
        # through numpy, and this runs for every sequence of every request.
        tokens = tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
        if min(tokens) >= 0 and max(tokens) < vocab:
            return tokens
        j = next(j for j, t in enumerate(tokens) if not 0 <= t < vocab)
        raise invalid(f"{where}.tokens.ids[{j}]: token id {int(tokens[j])} is outside the vocabulary "
                      f"[0, {vocab})")

    def _check_text(self, text: tuple[str, str], where: str) -> None:
        if self.tokenizer is None:
            raise invalid(f"{where}.text: this server does not tokenize text; send token ids "
                          "(tokenize with ModelInfo.tokenizer_json)")
        prompt, response = text
        if not prompt and not response:
            raise invalid(f"{where}.text: prompt and response are both empty")
        check_chars(prompt, self.limits.max_text_chars, f"{where}.text.prompt")
        check_chars(response, self.limits.max_text_chars, f"{where}.text.response")
        check_unicode(prompt, f"{where}.text.prompt")
        check_unicode(response, f"{where}.text.response")

    def _tokenize(self, text: tuple[str, str], where: str) -> list[int]:
        self._check_text(text, where)
        return encode_ids(self.tokenizer, [text])[0]

    def _fit(self, ids: list[int], truncation: str, where: str) -> list[int]:
        m = self.limits.max_sequence_length
        if len(ids) <= m:
            return ids
        if truncation == "left":
            return ids[-m:]
        if truncation == "right":
            return ids[:m]
        raise invalid(f"{where}: length {len(ids)} exceeds max_sequence_length {m} (set truncation to cut it)")


def check_unicode(text: str, where: str) -> None:
    """JSON's \\uD800-style escapes decode to unpaired surrogates, which no tokenizer takes (and UTF-8 cannot carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise invalid(f"{where}: not valid Unicode, unpaired surrogate at character {e.start}") from None
