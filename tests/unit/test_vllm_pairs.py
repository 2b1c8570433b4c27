"""vLLM's /score and /rerank pairs (frontends/vllm_pairs.py), without a server: counted and refused
before any tokenizing, each distinct text tokenized once, and the same ids the framework routes'
Encoder gives each pair (issue 29: a query was tokenized again for every document)."""

from __future__ import annotations

import collections
import pathlib
import random

import pytest

from rmscore.core.errors import ScoreError
from rmscore.frontends.reward_text import Encoder, compile_chat_template
from rmscore.frontends.vllm_pairs import broadcast, encode_pairs, pair_layout

ROOT = pathlib.Path(__file__).resolve().parents[2]
BERT_JSON = (ROOT / "models" / "default" / "tokenizer.json").read_text()
WORDS = "the sky is blue because air scatters light a prime number seven why name".split()


def roberta_like_json() -> str:
    """A tokenizer whose pair layout is RoBERTa's: <s> A </s></s> B </s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *WORDS, "first", "probe", "text", "second"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return tok.to_str()


def random_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40))) for _ in range(30)]
    pairs = [(rng.choice(texts), rng.choice(texts)) for _ in range(n)]
    return [p for p in pairs if p != ("", "")]


class Counting:
    """The encoder's tokenizer, counting the texts it is asked to encode."""

    def __init__(self, tok):
        self.tok, self.calls = tok, collections.Counter()

    def encode(self, text, *args, **kwargs):
        self.calls[text] += 1
        return self.tok.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


@pytest.mark.parametrize("tokenizer_json", [BERT_JSON, roberta_like_json()], ids=["bert", "roberta"])
@pytest.mark.parametrize("max_len", [12, 40, 512])
def test_same_ids_as_the_encoder_cuts_included(tokenizer_json, max_len):
    # max_len 12 and 40 make most pairs too long: the first text loses its start, or a second text
    # too long alone keeps the pair's last max_len tokens, as Encoder.encode_one cuts them.
    enc = Encoder(tokenizer_json, max_len, strip=("seven",))
    pairs = random_pairs(300, max_len)
    assert encode_pairs(enc, pairs) == [enc.encode_one(enc.strip_pair(p)) for p in pairs]


def test_the_pair_layout_is_the_post_processors():
    assert pair_layout(Encoder(BERT_JSON, 512).plain) == ([101], [102], [102])  # [CLS] A [SEP] B [SEP]
    assert pair_layout(Encoder(roberta_like_json(), 512).plain) == ([1], [2, 2], [2])


def test_each_distinct_text_is_tokenized_once():
    enc = Encoder(BERT_JSON, 512)
    enc.plain = counting = Counting(enc.plain)
    query = "why is the sky blue " * 500  # long: it was tokenized again for each of the 200 pairs
    docs = [f"because air scatters light {i % 50}" for i in range(200)]
    ids = encode_pairs(enc, broadcast([query], docs, 1024))
    assert len(ids) == 200 and all(len(x) == 512 for x in ids)
    asked = {t: n for t, n in counting.calls.items() if t.startswith(("why", "because"))}
    assert asked == {t: 1 for t in [query, *docs]}  # the query and the 50 distinct documents
    assert len(asked) == 51


def test_per_text_cuts_keep_each_texts_first_tokens():
    enc = Encoder(BERT_JSON, 512)
    tok = enc.plain
    q, d = "the sky is blue because air scatters light", "a prime number is seven"
    (got,) = encode_pairs(enc, [(q, d)], first_max=3, second_max=2)
    head_q, head_d = tok.encode(q, add_special_tokens=False).ids[:3], tok.encode(d, add_special_tokens=False).ids[:2]
    assert got == [101, *head_q, 102, *head_d, 102]


def test_with_a_chat_template_each_distinct_pair_is_encoded_once():
    template = compile_chat_template("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}")
    enc = Encoder(BERT_JSON, 512, chat_template=template)
    seen = []
    one = enc.encode_one
    enc.encode_one = lambda item, *a, **kw: seen.append(item) or one(item, *a, **kw)
    pairs = broadcast(["why is the sky blue"], ["air", "light", "air"], 1024)
    ids = encode_pairs(enc, pairs)
    # vLLM's score-pair rendering: a query and a document message, special tokens added.
    want = [one(f"<query> {q} <document> {d} ", True) for q, d in pairs]
    assert ids == want and ids[0] == ids[2] and ids[0][0] == 101 and ids[0][-1] == 102
    assert seen == ["<query> why is the sky blue <document> air ", "<query> why is the sky blue <document> light "]


def test_pairs_are_counted_before_anything_is_read():
    assert broadcast(["q"], ["a", "b"], 2) == [("q", "a"), ("q", "b")]
    assert broadcast(["q", "r"], ["a", "b"], 2) == [("q", "a"), ("r", "b")]
    with pytest.raises(ScoreError) as e:
        broadcast(["q"], ["a"] * 3, 2, ("query", "documents"))
    assert e.value.message.startswith("documents: 3 pairs exceed max_sequences_per_request 2")
    for first, second in ([[], ["a"]], [["q"], []], [["q", "r"], ["a", "b", "c"]]):
        with pytest.raises(ScoreError):
            broadcast(first, second, 8)


def test_an_empty_pair_and_a_lone_surrogate_are_refused():
    enc = Encoder(BERT_JSON, 512)
    with pytest.raises(ScoreError, match=r"text_1/text_2\[1\]: empty pair"):
        encode_pairs(enc, [("q", "a"), ("", "")])
    with pytest.raises(ScoreError, match=r"documents\[1\]: not valid Unicode"):
        encode_pairs(enc, [("q", "a"), ("q", "\ud800")], names=("query", "documents"))
    with pytest.raises(ScoreError, match=r"query\[0\]: not valid Unicode"):
        encode_pairs(enc, [("\ud800", "a")], names=("query", "documents"))


def test_a_text_over_max_text_chars_is_refused_before_any_is_tokenized():
    enc = Encoder(BERT_JSON, 512, max_chars=100)
    enc.plain = counting = Counting(enc.plain)
    with pytest.raises(ScoreError, match=r"documents\[2\]"):
        encode_pairs(enc, [("q", "a"), ("q", "b"), ("q", "x" * 101)], names=("query", "documents"))
    assert not counting.calls
