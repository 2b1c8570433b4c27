"""vLLM's rerank request and response (vllm_protocol.RerankIn, VllmRoutes.rerank_response), without
a server: shapes rebuilt from vLLM's scoring/protocol.py (53158688) and serving.py (a1140c1b)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from rmscore.frontends.vllm_api import RerankIn, ScoreIn, VllmRoutes


def routes() -> VllmRoutes:
    r = object.__new__(VllmRoutes)  # only the model's name is read
    r.core = SimpleNamespace(repo=SimpleNamespace(name="default"))
    return r


def request(rid: str | None = None):
    return SimpleNamespace(headers={"x-request-id": rid} if rid else {})


def test_results_best_first_with_each_documents_index_and_text():
    body = RerankIn(query="q", documents=["a", "b", "c", "d"])
    out = routes().rerank_response(body, [0.2, 0.9, 0.2, 0.5], 40, request("r-1"))
    assert set(out) == {"id", "model", "usage", "results"} and out["id"] == "score-r-1"
    assert out["model"] == "default" and out["usage"] == {"prompt_tokens": 40, "total_tokens": 40}
    assert [r["index"] for r in out["results"]] == [1, 3, 0, 2]  # ties keep the documents' order
    assert out["results"][0] == {"index": 1, "document": {"text": "b", "multi_modal": None}, "relevance_score": 0.9}


@pytest.mark.parametrize("top_n, kept", [(0, 3), (-1, 3), (2, 2), (3, 3), (9, 3)])
def test_top_n_above_zero_keeps_that_many(top_n, kept):
    body = RerankIn(query="q", documents=["a", "b", "c"], top_n=top_n)
    assert len(routes().rerank_response(body, [0.1, 0.2, 0.3], 9, request())["results"]) == kept


def test_request_fields_as_vllm_reads_them():
    body = RerankIn(query="q", documents="one document", return_documents=False, max_tokens_per_doc=4)
    assert body.document_list() == ["one document"] and body.max_tokens_per_doc == 4
    assert body.model_extra == {"return_documents": False}  # not a vLLM field: ignored, as there
    for bad in ({"documents": ["a"]}, {"query": "q"}, {"query": {"content": []}, "documents": ["a"]},
                {"query": "q", "documents": ["a"], "max_tokens_per_query": -1}):
        with pytest.raises(ValidationError):
            RerankIn(**bad)
    first, second, field = ScoreIn(queries="q", documents=["a", "b"], max_tokens_per_query=2).sides()
    assert (first, second, field) == (["q"], ["a", "b"], ("queries", "documents"))
