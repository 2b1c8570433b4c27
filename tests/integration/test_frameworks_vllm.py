"""vLLM's pooling API (/classify, /score, /pooling) on the FastAPI server, with vLLM's request and
response schemas (docs/frameworks/vllm-api.md cites the vLLM source), and rmscore's own route moved
to /rmscore/v1/score with /v1/score kept as its deprecated alias.

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
    # A conversation: the last message is judged against what came before it.
    r = http.post("/classify", json={"messages": [{"role": "user", "content": PAIRS[1][0]},
                                                  {"role": "assistant", "content": PAIRS[1][1]}]})
    assert r.status_code == 200, r.text
    assert_scores(r.json()["data"][0]["probs"], [sigmoid(raw([PAIRS[1]])[0])])


def test_own_route_moved_and_old_path_kept_as_alias(http):
    body = {"sequences": [{"prompt": p, "response": c} for p, c in PAIRS]}
    new, old = http.post("/rmscore/v1/score", json=body), http.post("/v1/score", json=body)
    assert new.status_code == old.status_code == 200
    assert new.json()["scores"] == old.json()["scores"]
    assert_scores(new.json()["scores"], raw(PAIRS))
    ops = http.get("/openapi.json").json()["paths"]
    assert ops["/v1/score"]["post"].get("deprecated") is True and not ops["/rmscore/v1/score"]["post"].get("deprecated")


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
