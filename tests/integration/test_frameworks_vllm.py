"""vLLM's pooling API (/classify, /score and /v1/score, /rerank, /v1/rerank and /v2/rerank,
/pooling, ...) on the FastAPI server, with vLLM's request and response schemas
(docs/frameworks/vllm-api.md cites the vLLM source); rmscore's own route is /rmscore/v1/score.

The server is the default-flag one the client tests share (test_client.shared_server).
"""

from __future__ import annotations

import base64
import math

import httpx
import numpy as np
import pytest

from test_client import HTTP_KIND, assert_scores, local_tokenizer, ort_scores, shared_server

PAIRS = [("Why is the sky blue?", "Because air scatters blue light more."), ("Name a prime number.", "Seven.")]


@pytest.fixture(scope="module")
def http():
    s = shared_server(HTTP_KIND)
    with httpx.Client(base_url=s.base_url, timeout=60) as c:
        yield c


def raw(pairs) -> list[float]:
    return ort_scores([local_tokenizer().encode(p, r).ids for p, r in pairs])


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def check_envelope(body: dict, prefix: str, n: int) -> None:
    """vLLM's ClassificationResponse / ScoreResponse / PoolingResponse fields."""
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"].startswith(prefix + "-") and body["object"] == "list" and isinstance(body["created"], int)
    assert body["model"] == "default" and len(body["data"]) == n
    assert [d["index"] for d in body["data"]] == list(range(n))
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
                                  "completion_tokens_details"}
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_score_text_1_against_text_2(http):
    want = raw(PAIRS)
    r = http.post("/score", json={"model": "default", "text_1": [p for p, _ in PAIRS],
                                  "text_2": [c for _, c in PAIRS]})
    assert r.status_code == 200, r.text
    check_envelope(r.json(), "score", 2)
    assert all(d["object"] == "score" for d in r.json()["data"])
    assert_scores([d["score"] for d in r.json()["data"]], [sigmoid(x) for x in want])
    # One text_1 against several text_2, raw rewards with use_activation false.
    r = http.post("/score", json={"text_1": PAIRS[0][0], "text_2": [PAIRS[0][1], "Seven."],
                                  "use_activation": False, "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    assert_scores([d["score"] for d in r.json()["data"]], raw([PAIRS[0], (PAIRS[0][0], "Seven.")]))


def test_classify_and_pooling(http):
    texts = ["a short text to score", "another one"]
    want = ort_scores([local_tokenizer().encode(t).ids for t in texts])
    r = http.post("/classify", json={"model": "default", "input": texts, "use_activation": False})
    assert r.status_code == 200, r.text
    check_envelope(r.json(), "classify", 2)
    data = r.json()["data"]
    assert all(set(d) == {"index", "label", "probs", "num_classes"} and d["num_classes"] == 1 for d in data)
    assert_scores([d["probs"][0] for d in data], want)
    # /pooling pools a classifier as vLLM's classify task does: the activation unless use_activation is
    # false (before: the raw reward by default, another number than vLLM's); the id from X-Request-Id.
    r = http.post("/pooling", json={"input": texts[0]}, headers={"X-Request-Id": "rollout-7"})
    assert r.status_code == 200, r.text
    check_envelope(r.json(), "pooling", 1)
    assert r.json()["id"] == "pooling-rollout-7"
    assert r.json()["data"][0]["object"] == "pooling"
    assert_scores(r.json()["data"][0]["data"], [sigmoid(want[0])])
    r = http.post("/pooling", json={"input": texts[0], "use_activation": False})
    assert_scores(r.json()["data"][0]["data"], want[:1])
    # A conversation is rendered whole with the model's chat template, as vLLM renders it; the default
    # model has none, so it is refused as vLLM refuses it (test_chat_template_routes.py renders one).
    r = http.post("/classify", json={"messages": [{"role": "user", "content": PAIRS[1][0]},
                                                  {"role": "assistant", "content": PAIRS[1][1]}]})
    assert r.status_code == 400 and "default chat template" in r.json()["error"]["message"], r.text


def test_v1_score_is_vllms_score_route(http):
    # vLLM serves /score and /v1/score with one handler; /v1/score was rmscore's deprecated alias
    # of its own route, so a vLLM body there got 422.
    body = {"text_1": PAIRS[0][0], "text_2": [PAIRS[0][1], "Seven."], "use_activation": False}
    v1, plain = http.post("/v1/score", json=body), http.post("/score", json=body)
    assert v1.status_code == plain.status_code == 200, v1.text
    check_envelope(v1.json(), "score", 2)
    assert [d["score"] for d in v1.json()["data"]] == [d["score"] for d in plain.json()["data"]]
    assert_scores([d["score"] for d in v1.json()["data"]], raw([PAIRS[0], (PAIRS[0][0], "Seven.")]))
    # rmscore's own body there is a bad vLLM request now, answered in vLLM's shape.
    r = http.post("/v1/score", json={"sequences": [{"prompt": "a", "response": "b"}]})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    own = http.post("/rmscore/v1/score", json={"sequences": [{"prompt": p, "response": c} for p, c in PAIRS]})
    assert own.status_code == 200
    assert_scores(own.json()["scores"], raw(PAIRS))
    ops = http.get("/openapi.json").json()["paths"]
    assert not any(op.get("deprecated") for path in ops.values() for op in path.values())


DOCS = ["Because air scatters blue light more.", "Seven.", "The sky is green.", "Blue light scatters."]


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_as_vllm_answers_it(http, path):
    query = PAIRS[0][0]
    want = [sigmoid(x) for x in raw([(query, d) for d in DOCS])]
    r = http.post(path, json={"model": "default", "query": query, "documents": DOCS, "top_n": 3,
                              "return_documents": True}, headers={"X-Request-Id": "rr-1"})
    assert r.status_code == 200, r.text
    body = r.json()
    # vLLM's RerankResponse (scoring/protocol.py): no object/created; usage of two fields; the
    # documents best first, top_n of them.
    assert set(body) == {"id", "model", "usage", "results"} and body["id"] == "score-rr-1"
    assert body["model"] == "default" and set(body["usage"]) == {"prompt_tokens", "total_tokens"}
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])[:3]
    assert [x["index"] for x in body["results"]] == order
    for x in body["results"]:
        assert set(x) == {"index", "document", "relevance_score"}
        assert x["document"] == {"text": DOCS[x["index"]], "multi_modal": None}
    assert_scores([x["relevance_score"] for x in body["results"]], [want[i] for i in order])
    # One document as a string, the raw reward with use_activation false, every result without top_n.
    r = http.post(path, json={"query": query, "documents": DOCS[1], "use_activation": False})
    assert r.status_code == 200, r.text
    assert_scores([x["relevance_score"] for x in r.json()["results"]], raw([(query, DOCS[1])]))


def test_rerank_honours_max_tokens_per_doc_and_query(http):
    tok = local_tokenizer()
    query, doc = PAIRS[0][0], DOCS[0]
    q, d = tok.encode(query, add_special_tokens=False), tok.encode(doc, add_special_tokens=False)
    q.truncate(3)
    d.truncate(2)
    (want,) = ort_scores([tok.post_process(q, d).ids])
    r = http.post("/rerank", json={"query": query, "documents": [doc], "max_tokens_per_query": 3,
                                   "max_tokens_per_doc": 2, "use_activation": False})
    assert r.status_code == 200, r.text
    assert_scores([r.json()["results"][0]["relevance_score"]], [want])
    assert r.json()["usage"]["prompt_tokens"] == 3 + 2 + 3


def test_pairs_over_max_sequences_per_request_are_400_before_tokenizing(http):
    # A short body of one query and many documents costs a model sequence per pair: capped at
    # max_sequences_per_request (1024 on this server), as rmscore's own route caps sequences.
    many = ["x"] * 1025
    for path, body, field in [("/score", {"text_1": "q" * 100_000, "text_2": many}, "text_2"),
                              ("/v1/score", {"queries": "q", "documents": many}, "documents"),
                              ("/rerank", {"query": "q", "documents": many}, "documents"),
                              ("/v2/rerank", {"query": "q", "documents": many}, "documents")]:
        r = http.post(path, json=body)
        err = r.json()["error"]
        assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}, (path, r.text)
        assert err["code"] == 400 and err["type"] == "BadRequestError"
        assert err["message"].startswith(f"{field}: 1025 pairs exceed max_sequences_per_request 1024"), err
    r = http.post("/rerank", json={"query": "q", "documents": ["x"] * 1024, "top_n": 1})
    assert r.status_code == 200 and len(r.json()["results"]) == 1


def test_malformed_vllm_requests_are_400_in_vllms_error_shape(http):
    # vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}, code the HTTP status (before:
    # rmscore's 422 {"error": {"code": "INVALID_ARGUMENT", "message"}}, which vLLM clients do not read).
    r = http.post("/score", json={"text_1": ["a", "b"], "text_2": ["x", "y", "z"]})
    err = r.json()["error"]
    assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}
    assert err["code"] == 400 and err["type"] == "BadRequestError" and "text_1" in err["message"]
    r = http.post("/classify", json={"input": []})
    assert r.status_code == 400 and "input" in r.json()["error"]["message"]
    # A body the schema refuses: vLLM's validation handler, type "Bad Request" and the field as param.
    r = http.post("/pooling", json={"input": "x", "truncate_prompt_tokens": -5})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "Bad Request" and err["param"] == "truncate_prompt_tokens"
    r = http.post("/tokenize", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    # A content part whose text is not a string (before: a bare 500).
    r = http.post("/classify", json={"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})
    assert r.status_code == 400 and "messages[0].content[0].text" in r.json()["error"]["message"]
    # A rerank body the schema refuses (no query; a negative per-document cut), in vLLM's shape.
    for path, body, param in [("/v1/rerank", {"documents": ["a"]}, "query"),
                              ("/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": -1},
                               "max_tokens_per_doc")]:
        r = http.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # rmscore's own route keeps its contract.
    r = http.post("/rmscore/v1/score", json={"sequences": []})
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_ARGUMENT"


def test_models_and_health_as_vllm_example_clients_start(http):
    # vLLM's pooling example clients begin with GET /v1/models and take data[0].id as the model.
    r = http.get("/v1/models")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    card = body["data"][0]
    assert card["id"] == "default" and card["object"] == "model" and card["max_model_len"] == 512
    assert {"created", "owned_by", "root", "parent", "permission"} <= set(card)
    r = http.get("/health")
    assert r.status_code == 200 and r.content == b""


def test_tokenize_as_the_classify_example_calls_it(http):
    text = "a short text to score"
    r = http.post("/tokenize", json={"model": "default", "prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    want = local_tokenizer().encode(text)
    assert body["tokens"] == want.ids and body["count"] == len(want.ids) and body["max_model_len"] == 512
    assert body["token_strs"] == want.tokens
    r = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert r.json()["tokens"] == local_tokenizer().encode(text, add_special_tokens=False).ids
    assert r.json()["token_strs"] is None


def test_truncate_prompt_tokens_as_vllm(http):
    # Without truncation_side it cuts on the tokenizer's side (right here, Hugging Face's default; before:
    # the left), and a value above the model's maximum is refused as vLLM refuses it (before: accepted).
    ids = list(range(2000, 2040))
    kept = {}
    for side in (None, "right", "left"):
        body = {"input": ids, "truncate_prompt_tokens": 8, "use_activation": False}
        if side:
            body["truncation_side"] = side
        r = http.post("/classify", json=body)
        assert r.status_code == 200, r.text
        kept[side] = r.json()["data"][0]["probs"][0]
    right, left = ort_scores([ids[:8], ids[-8:]])
    assert_scores([kept[None], kept["right"], kept["left"]], [right, right, left])
    r = http.post("/classify", json={"input": "x", "truncate_prompt_tokens": 513})
    assert r.status_code == 400 and "max_model_len (512)" in r.json()["error"]["message"]
    # 0 keeps nothing: refused on either side, ids or text (before: the left kept every id and scored
    # them, the right an empty sequence, refused as empty).
    for route, body in (("/classify", {"input": [101, 2000, 3000, 102]}), ("/pooling", {"input": "x y"}),
                        ("/score", {"text_1": "q", "text_2": ["d"]})):
        for side in ("left", "right"):
            r = http.post(route, json={**body, "truncate_prompt_tokens": 0, "truncation_side": side})
            err = r.json()["error"]
            assert r.status_code == 400 and err["message"].startswith("truncate_prompt_tokens: 0 keeps no tokens"), \
                (route, side, r.text)


def test_ids_over_the_sent_bound_are_refused_whether_or_not_truncate_prompt_tokens_cuts_them(http):
    # docs/contract.md, "Input bounds": at most 64 x max_sequence_length ids a sequence, truncation or
    # not. Before, truncate_prompt_tokens cut them first: 2.5M ids a request were scored, six such
    # bodies took the server from 381 to 806 MB, and the bytes budget counted the 512 kept.
    ids = [2000 + i % 500 for i in range(64 * 512 + 1)]
    want = ("sequences[0].tokens.ids: length 32769 exceeds 32768, the most a sequence may send even with "
            "truncation (64 x max_sequence_length 512); cut it before sending")
    for route, body in (("/classify", {"input": [ids]}), ("/classify", {"input": [ids], "truncate_prompt_tokens": 512}),
                        ("/pooling", {"input": ids, "truncate_prompt_tokens": 10})):
        r = http.post(route, json=body)
        assert r.status_code == 400 and r.json()["error"]["message"] == want, (route, body.keys(), r.text[:300])
    r = http.post("/classify", json={"input": [ids[:64 * 512]], "truncate_prompt_tokens": 8})
    assert r.status_code == 200, r.text[:300]  # at the bound, cut as asked



def test_fields_vllm_honours_or_refuses_are_not_ignored(http):
    """Before: dimensions, normalize, encoding_format, priority and task were accepted and ignored.
    vLLM (0235532e: pooling_params.py verify, pooling/base/protocol.py) refuses or honours each."""
    text = "a short text to score"
    (want,) = ort_scores([local_tokenizer().encode(text).ids])
    # encoding_format base64: the float32 bytes of `data`, base64 (native order is little here).
    r = http.post("/pooling", json={"input": text, "encoding_format": "base64", "use_activation": False})
    assert r.status_code == 200, r.text
    (got,) = np.frombuffer(base64.b64decode(r.json()["data"][0]["data"]), dtype="<f4")
    assert_scores([float(got)], [want])
    r = http.post("/pooling", json={"input": text, "encoding_format": "base64", "embed_dtype": "float16",
                                    "endianness": "big", "use_activation": False})
    (got,) = np.frombuffer(base64.b64decode(r.json()["data"][0]["data"]), dtype=">f2")
    assert abs(float(got) - want) <= 1e-3 * max(1.0, abs(want))
    # The deprecated spelling of use_activation is read, as vLLM's get_use_activation reads it.
    r = http.post("/classify", json={"input": text, "softmax": False})
    assert_scores(r.json()["data"][0]["probs"], [want])
    # Refused as vLLM refuses them, in its error shape.
    for path, body, field in [("/pooling", {"dimensions": 8}, "dimensions"),
                              ("/pooling", {"normalize": True}, "normalize"),
                              ("/pooling", {"task": "embed"}, "task"),
                              ("/pooling", {"encoding_format": "bytes"}, "encoding_format"),
                              ("/classify", {"priority": 3}, "priority"),
                              ("/score", {"text_1": "a", "text_2": "b", "priority": -1}, "priority")]:
        r = http.post(path, json={"input": text, **body})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == 400 and field in err["message"] + str(err["param"]), \
            (path, body, r.text)
