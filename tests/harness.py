"""One way to call any server kind from the conformance suite: the same request, either transport.

Requests are plain dicts ({"tokens": [...]} / {"prompt": .., "response": ..} / {}),
and every failure comes back as CallError(code name, message), whatever the
transport, so one assertion covers gRPC and HTTP alike.
"""

from __future__ import annotations

import json
import pathlib

import grpc
import httpx
import numpy as np

from rmscore_client.v1 import reward_pb2 as pb
from rmscore_client.v1 import reward_pb2_grpc as pbg

ROOT = pathlib.Path(__file__).resolve().parents[1]
MANIFEST = json.loads((ROOT / "models" / "default" / "manifest.json").read_text())
GOLDEN_IDS = [g["input_ids"] for g in MANIFEST["golden"]]
GOLDEN_SCORES = np.array([g["score"] for g in MANIFEST["golden"]])
VOCAB = MANIFEST["vocab_size"]
MAX_LEN = MANIFEST["max_sequence_length"]
TRUNC = {"none": pb.TRUNCATION_NONE, "left": pb.TRUNCATION_LEFT, "right": pb.TRUNCATION_RIGHT}


class CallError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def to_proto(seq: dict) -> pb.Sequence:
    if "tokens" in seq:
        return pb.Sequence(tokens=pb.TokenIds(ids=seq["tokens"]))
    if "prompt" in seq:
        return pb.Sequence(text=pb.TextPair(prompt=seq["prompt"], response=seq["response"]))
    return pb.Sequence()


class Caller:
    def __init__(self, server):
        self.server = server
        self.grpc = server.transport == "grpc"
        if self.grpc:
            self.channel = grpc.insecure_channel(server.target, options=[
                ("grpc.max_send_message_length", 64 << 20)])
            self.stub = pbg.RewardModelStub(self.channel)
        else:
            self.http = httpx.Client(base_url=server.base_url, timeout=120)

    def score(self, seqs: list[dict], truncation: str = "none", timeout_s: float | None = 120) -> list[float]:
        return self.score_full(seqs, truncation, timeout_s)["scores"]

    def score_full(self, seqs, truncation="none", timeout_s=120) -> dict:
        if self.grpc:
            try:
                r = self.stub.Score(pb.ScoreRequest(sequences=[to_proto(s) for s in seqs],
                                                    truncation=TRUNC[truncation]), timeout=timeout_s)
            except grpc.RpcError as e:
                raise CallError(e.code().name, e.details() or "") from None
            return {"scores": list(r.scores), "model_version": r.model_version,
                    "timings": {"total_ms": r.timings.total_ms, "inference_ms": r.timings.inference_ms,
                                "queue_ms": r.timings.queue_ms}}
        body = {"sequences": seqs, "truncation": truncation}
        if timeout_s is not None and timeout_s < 60:
            body["timeout_ms"] = timeout_s * 1000
        return self.post(body, timeout_s=max(timeout_s or 120, 10))

    def post(self, body, raw: bytes | None = None, timeout_s: float = 120) -> dict:
        try:
            r = (self.http.post("/v1/score", content=raw, headers={"content-type": "application/json"},
                                timeout=timeout_s)
                 if raw is not None else self.http.post("/v1/score", json=body, timeout=timeout_s))
        except httpx.ConnectError as e:  # what gRPC calls UNAVAILABLE
            raise CallError("UNAVAILABLE", str(e)) from None
        if r.status_code != 200:
            err = r.json()["error"]
            raise CallError(err["code"], err["message"])
        return r.json()

    def info(self) -> dict:
        if self.grpc:
            m = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            return {f.name: getattr(m, f.name) for f in m.DESCRIPTOR.fields}
        return self.http.get("/v1/model").json()

    def close(self) -> None:
        self.channel.close() if self.grpc else self.http.close()
