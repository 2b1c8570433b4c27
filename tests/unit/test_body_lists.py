"""The HTTP request models' lists report one error, not one per item (frontends/body_lists.py).

pydantic gave one error per bad item and FastAPI converted each: 5M empty arrays where `sequences`
belongs took 3.3 s to validate and 26 s and 6 GB to convert. Each case below gave thousands to
millions of errors before; now one (for a union, one per member at most), with the place of the first."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rmscore.core.config import MOST_LIST_ITEMS
from rmscore.frontends.http_models import ScoreIn
from rmscore.frontends.openrlhf import GetRewardIn
from rmscore.frontends.vllm_protocol import ClassifyIn, RerankIn
from rmscore.frontends.vllm_protocol import ScoreIn as VllmScoreIn

N = 200_000  # ids of the wrong kind: as many errors as this before
M = MOST_LIST_ITEMS - 10  # texts or sequences of the wrong kind, within the bound on their count

CASES = [
    (ScoreIn, {"sequences": [{}] * (MOST_LIST_ITEMS + 1)}, [("sequences",)], "at most 65536 items"),
    (ScoreIn, {"sequences": [[]] * 5_000_000}, [("sequences", 0)], "valid dictionary"),
    (ScoreIn, {"sequences": [{}] * 5 + [[]] * M}, [("sequences", 5)], "valid dictionary"),
    (ScoreIn, {"sequences": [{"tokens": [1, 2] + ["x"] * N}]}, [("sequences", 0, "tokens", 2)], "valid integer"),
    (ScoreIn, {"sequences": [{"tokens": [1, True] + [2] * N}]}, [("sequences", 0, "tokens", 1)], "valid integer"),
    (GetRewardIn, {"query": ["q"] * 3 + [[]] * M}, [("query", 3)], "valid string"),
    (GetRewardIn, {"query": ["q"] * (MOST_LIST_ITEMS + 1)}, [("query",)], "at most 65536 items"),
    (ClassifyIn, {"input": [7] * N + ["x"]},
     [("input", "list[int]", N), ("input", "list[list[int]]", 0), ("input", "str"), ("input", "list[str]", 0)],
     "valid integer"),
    (ClassifyIn, {"input": [[7]] * 1000 + [[7, "x"]]},
     [("input", "list[int]", 0), ("input", "list[list[int]]", 1000, 1), ("input", "str"), ("input", "list[str]", 0)],
     "valid integer"),
    (ClassifyIn, {"input": [[]] * (MOST_LIST_ITEMS + 1)},
     [("input", "list[int]", 0), ("input", "list[list[int]]"), ("input", "str"), ("input", "list[str]", 0)],
     "valid integer"),
    (ClassifyIn, {"messages": [{"role": "user", "content": "x"}] + [[]] * M}, [("messages", 1)], "valid dictionary"),
    (VllmScoreIn, {"text_1": "q", "text_2": ["d"] + [1] * M}, [("text_2", "str"), ("text_2", "list[str]", 1)],
     "valid string"),
    (RerankIn, {"query": "q", "documents": ["d"] * (MOST_LIST_ITEMS + 1)}, [("documents", "str"), ("documents", "list[str]")],
     "valid string"),
]


@pytest.mark.parametrize("model,doc,locs,message", CASES, ids=[f"{c[0].__module__.split('.')[-1]}.{c[0].__name__}:{i}"
                                                              for i, c in enumerate(CASES)])
def test_a_list_is_reported_by_its_first_bad_item_alone(model, doc, locs, message):
    with pytest.raises(ValidationError) as e:
        model.model_validate(doc)
    errors = e.value.errors()
    assert [err["loc"] for err in errors] == locs, errors[:4]
    assert message in errors[0]["msg"], errors[0]


def test_lists_of_the_right_kind_validate_as_before():
    assert len(ScoreIn.model_validate({"sequences": [{"tokens": list(range(512))}] * 1024}).sequences) == 1024
    for doc in ({"input": [1, 2, 3]}, {"input": [[1, 2], [3]]}, {"input": ["a", "b"]}, {"input": "a"}):
        assert ClassifyIn.model_validate(doc).input == doc["input"]
    assert GetRewardIn.model_validate({"query": ["a"] * MOST_LIST_ITEMS}).query[-1] == "a"
    # Inside an item, a content error is pydantic's, with its place; the first one only (before: every one).
    with pytest.raises(ValidationError) as e:
        ScoreIn.model_validate({"sequences": [{"tokens": [1]}, {"tokens": "x"}, {"bogus": 1}]})
    assert [err["loc"] for err in e.value.errors()] == [("sequences", 1, "tokens")]
