"""Writes the seed corpora (checked in): valid and typical invalid requests, serialized.

    .venv/bin/python tests/fuzz/make_corpus.py

corpus/proto/: ScoreRequest and ScoreStreamRequest wire bytes (fuzz_py_grpc and the
C++ fuzz_cpp_validation); corpus/json/: /rmscore/v1/score and /get_reward bodies (fuzz_py_http).
Seeds cover each branch of the contract's error table once, so that mutation starts
next to every refusal rather than having to discover the message layout.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

from rmscore_client.v1 import reward_pb2 as pb

HERE = pathlib.Path(__file__).resolve().parent
VOCAB, MAX_LEN, MAX_SEQS = 30522, 512, 1024


def tokens(ids) -> pb.Sequence:
    return pb.Sequence(tokens=pb.TokenIds(ids=ids))


def text(prompt, response) -> pb.Sequence:
    return pb.Sequence(text=pb.TextPair(prompt=prompt, response=response))


def proto_seeds() -> list[bytes]:
    L, R = pb.TRUNCATION_LEFT, pb.TRUNCATION_RIGHT
    reqs = [
        pb.ScoreRequest(sequences=[tokens([101, 7592, 2088, 102])]),
        pb.ScoreRequest(sequences=[tokens([101, 2023, 102]), tokens([101] + [2003] * 40 + [102]), tokens([5])],
                        truncation=L),
        pb.ScoreRequest(sequences=[tokens(list(range(1, MAX_LEN + 90)))], truncation=R),
        pb.ScoreRequest(sequences=[tokens(list(range(1, MAX_LEN + 2)))]),  # too long, no truncation
        pb.ScoreRequest(sequences=[text("What is 2+2?", "4")]),
        pb.ScoreRequest(sequences=[tokens([101, 102]), text("p", "r")]),  # mixed kinds
        pb.ScoreRequest(sequences=[tokens([101, 102]), pb.Sequence()]),  # no input set
        pb.ScoreRequest(sequences=[tokens([])]),
        pb.ScoreRequest(sequences=[tokens([101, VOCAB, 102])]),
        pb.ScoreRequest(sequences=[tokens([-1, 2**63 - 1, -(2**63)])]),
        pb.ScoreRequest(sequences=[tokens([7])] * (MAX_SEQS + 1)),
        pb.ScoreRequest(sequences=[tokens([101, 102])], truncation=7),  # proto3 enums are open
        pb.ScoreRequest(),
    ]
    items = [
        pb.ScoreStreamRequest(id="a", sequence=tokens([101, 7592, 102])),
        pb.ScoreStreamRequest(id="b", sequence=tokens(list(range(MAX_LEN + 5))), truncation=L),
        pb.ScoreStreamRequest(id="c", sequence=text("Say hi.", "hi")),
        pb.ScoreStreamRequest(id="d"),
    ]
    return [m.SerializeToString() for m in reqs + items]


def json_seeds() -> list[bytes]:
    bodies = [
        {"sequences": [{"tokens": [101, 7592, 2088, 102]}]},
        {"sequences": [{"tokens": [101, 2023, 102]}, {"tokens": [5] * 600}], "truncation": "left", "timeout_ms": 5000},
        {"sequences": [{"prompt": "What is 2+2?", "response": "4"}, {"prompt": "Hi", "response": ""}]},
        {"sequences": [{"tokens": [1, 2]}, {"prompt": "p", "response": "r"}]},
        {"sequences": [{"tokens": [-1, 30522]}], "truncation": "right"},
        {"sequences": [{}], "extra": 1},
        {"sequences": []},
        {"query": ["What is 2+2? 4", "Hello there"], "prompts": ["What is 2+2?", "Hi"], "labels": [1, None]},
        {"query": ["just a query"]},
    ]
    return [json.dumps(b).encode() for b in bodies] + [b'{"sequences": [{"tokens": [1, 2', b"[]", b"null"]


def write(name: str, seeds: list[bytes]) -> None:
    d = HERE / "corpus" / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for s in seeds:  # named by content, as libFuzzer names its own units
        (d / hashlib.sha1(s).hexdigest()).write_bytes(s)


if __name__ == "__main__":
    write("proto", proto_seeds())
    write("json", json_seeds())
    print(f"wrote {HERE / 'corpus'}")
