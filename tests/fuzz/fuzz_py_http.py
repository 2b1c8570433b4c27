"""Fuzz target: the FastAPI front end's JSON decoding and validation.

Bytes are POSTed as the body of `/rmscore/v1/score` and of `/get_reward` to the stack that
serves (`http_app.served_asgi`: the app over the real core inside every middleware, as `run`
gives it to uvicorn), in process through Starlette's TestClient, which re-raises any exception
the app lets escape. The core is marked serving and its queue (`submit_ids` and its
admission, the batcher and the model, not under test here) is replaced by a check of the
validated sequences that answers zeros. Every answer must be 200 with one score per
sequence, or the contract's error body. Seeds: corpus/json/.
"""

from __future__ import annotations

import functools
import json

from fuzz_common import check_sequences, core, main

ERROR_STATUSES = {422: "INVALID_ARGUMENT", 413: "RESOURCE_EXHAUSTED"}


@functools.cache
def client():
    from fastapi.testclient import TestClient

    from rmscore.core.batcher import Result
    from rmscore.core.scoring import SERVING
    from rmscore.frontends.http_app import served_asgi

    c = core()

    def submit_ids(seqs, deadline_s):
        check_sequences(seqs, len(seqs))

        async def answer():
            return Result(scores=[0.0] * len(seqs), total_ms=0.0, inference_ms=0.0)
        return answer()

    c.submit_ids = submit_ids  # what score_ids and score_in_parts queue through
    # The queue's admission goes with it: a queue that takes everything refuses only when not ready.
    c.check_admission = lambda deadline_s: c.check_ready()
    c.state = SERVING
    return TestClient(served_asgi(c), raise_server_exceptions=True)


def one_input(data: bytes) -> None:
    http = client()
    for route in ("/rmscore/v1/score", "/get_reward"):
        r = http.post(route, content=data, headers={"content-type": "application/json"})
        body = r.json()
        if r.status_code == 200:
            sent = json.loads(data)  # it was accepted, so it is JSON with the route's list
            scores, n = (body["rewards"], len(sent["query"])) if route == "/get_reward" else \
                (body["scores"], len(sent["sequences"]))
            assert len(scores) == n and all(s == 0.0 for s in scores), (n, body)
        else:
            assert ERROR_STATUSES.get(r.status_code) == body["error"]["code"], (r.status_code, body)
            assert isinstance(body["error"]["message"], str) and body["error"]["message"], body


if __name__ == "__main__":
    main(one_input)
