"""Access control (docs/contract.md): TLS and the shared bearer token, against every server kind.

Per kind one server runs with TLS and a token (a self-signed certificate for
127.0.0.1/localhost made here with `openssl`); the cheap kinds also get one
plaintext server with a token, since the C++ server installs its check through
a different credentials path without TLS. Refusals are checked on the wire
(exact code and message), in the server's metrics, and through the client
library and CLI, which must send the token, verify the certificate and never
retry UNAUTHENTICATED.
"""

from __future__ import annotations

import json
import pathlib
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import harness
import servers
from harness import GOLDEN_IDS as ALL_GOLDEN_IDS
from harness import GOLDEN_SCORES as ALL_GOLDEN_SCORES
from harness import pb, pbg
from rmscore_tools import launch
from rmscore_client import HttpRewardClient, RetryPolicy, RewardClient, Unauthenticated
from rmscore_tools.observe import metric

KINDS = servers.available_kinds()
# One plaintext+token server for each distinct credentials path: C++, Python gRPC, Python HTTP.
PLAIN_KINDS = [k for k in ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime") if k in KINDS]
MESSAGE = "missing or invalid bearer token"
TOL = 1e-4
RMSCORE = [sys.executable, "-m", "rmscore.cli"]
# The golden sequences up to 64 tokens: the 255..512-token ones take seconds on a busy CPU and
# add nothing to what is checked here.
_SHORT = [i for i, ids in enumerate(ALL_GOLDEN_IDS) if len(ids) <= 64]
GOLDEN_IDS = [ALL_GOLDEN_IDS[i] for i in _SHORT]
GOLDEN_SCORES = ALL_GOLDEN_SCORES[_SHORT]


@dataclass
class Creds:
    cert: pathlib.Path
    key: pathlib.Path
    token: str
    token_file: pathlib.Path
    wrong_token_file: pathlib.Path
    other_cert: pathlib.Path  # a certificate the servers were not given


def _self_signed(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="session")
def creds(tmp_path_factory) -> Creds:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is needed to make a test certificate")
    d = tmp_path_factory.mktemp("auth")
    cert, key = _self_signed(d, "server")
    other, _ = _self_signed(d, "other")
    token = "rm-" + secrets.token_urlsafe(24)
    # Whitespace around the token is not part of it (a trailing newline is the usual case).
    (d / "token").write_text(f"  {token}\n")
    (d / "wrong").write_text(token[:-1] + ("x" if token[-1] != "x" else "y"))
    return Creds(cert, key, token, d / "token", d / "wrong", other)


def tls_flags(c: Creds) -> dict:
    return dict(tls_cert_file=c.cert, tls_key_file=c.key, auth_token_file=c.token_file)


# TLS and tokens are the transports' (C++, Python gRPC, Python HTTP).
TLS_KINDS = servers.frontend_kinds()


@pytest.fixture(scope="module", params=TLS_KINDS)
def server(request, creds):
    s = servers.start(request.param, **tls_flags(creds))
    yield s
    s.stop()


def secure_channel(server, ca: pathlib.Path) -> grpc.Channel:
    return grpc.secure_channel(server.target, grpc.ssl_channel_credentials(ca.read_bytes()))


def unauthenticated_count(server) -> float:
    return metric(server, "rmscore_requests_total", code="UNAUTHENTICATED")


def client_for(server, **kw):
    cls = HttpRewardClient if server.transport == "http" else RewardClient
    return cls(server.base_url if server.transport == "http" else server.target, **kw)


# ---- raw calls, one per refused entry point --------------------------------------------------

def grpc_refusals(channel: grpc.Channel, metadata) -> list[grpc.RpcError]:
    """Every RewardModel method and reflection; returns each call's error (a success fails the test)."""
    stub = pbg.RewardModelStub(channel)
    calls = {
        "Score": lambda: stub.Score(pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[0]))]),
                                    metadata=metadata, timeout=30),
        "GetModelInfo": lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata, timeout=30),
        "ScoreStream": lambda: list(stub.ScoreStream(
            iter([pb.ScoreStreamRequest(id="0", sequence=pb.Sequence(tokens=pb.TokenIds(ids=GOLDEN_IDS[0])))]),
            metadata=metadata, timeout=30)),
        "reflection": lambda: list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=30)),
    }
    errors = []
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (name, e.value)
        assert e.value.details() == MESSAGE, (name, e.value.details())
        errors.append(e.value)
    return errors


def http_refusals(base_url: str, verify, headers: list) -> list[httpx.Response]:
    body = {"sequences": [{"tokens": GOLDEN_IDS[0]}]}
    with httpx.Client(base_url=base_url, verify=verify, headers=headers, timeout=30) as h:
        answers = [h.post("/rmscore/v1/score", json=body), h.get("/v1/model"), h.get("/v1/tokenizer"),
                   h.post("/get_reward", json={"query": ["x"]}), h.get("/docs"), h.get("/openapi.json")]
    for r in answers:
        assert r.status_code == 401, (r.request.url, r.status_code, r.text)
        assert r.json() == {"error": {"code": "UNAUTHENTICATED", "message": MESSAGE}}, r.text
        assert r.headers["www-authenticate"] == "Bearer"
    return answers


# ---- one TLS+token server per kind -------------------------------------------------------

@pytest.mark.parametrize("case", ["no token", "wrong token", "token without scheme", "other scheme",
                                  "two authorization headers"])
def test_call_without_the_right_token_is_refused(server, creds, case):
    # Two headers, even both right, are refused on every kind: the C++ server took the last, Python the
    # first, so which one counted depended on the server (and on a proxy in front of it).
    metadata = {"no token": None,
                "wrong token": [("authorization", "Bearer " + creds.wrong_token_file.read_text())],
                "token without scheme": [("authorization", creds.token)],
                "other scheme": [("authorization", "Basic " + creds.token)],
                "two authorization headers": [("authorization", "Bearer " + creds.token)] * 2}[case]
    before = unauthenticated_count(server)
    if server.transport == "grpc":
        with secure_channel(server, creds.cert) as ch:
            refused = len(grpc_refusals(ch, metadata))
    else:
        headers = [(k.title(), v) for k, v in metadata or ()]
        refused = len(http_refusals(server.base_url, launch.ssl_context(creds.cert), headers))
    # Each refusal counted once, under the same code name in every server.
    assert unauthenticated_count(server) - before == refused


def test_the_scheme_is_case_insensitive(server, creds):
    # RFC 7235: "bearer" is the same scheme as "Bearer" (before: refused on every kind).
    for scheme in ("bearer", "BEARER"):
        if server.transport == "grpc":
            with secure_channel(server, creds.cert) as ch:
                info = pbg.RewardModelStub(ch).GetModelInfo(
                    pb.GetModelInfoRequest(), metadata=[("authorization", f"{scheme} {creds.token}")], timeout=30)
            assert info.max_sequence_length == 512
        else:
            r = httpx.get(server.base_url + "/v1/model", headers={"Authorization": f"{scheme} {creds.token}"},
                          verify=launch.ssl_context(creds.cert), timeout=30)
            assert r.status_code == 200, r.text


def test_an_unknown_method_is_refused_like_a_known_one(server, creds):
    """Without the token every method is UNAUTHENTICATED, known or not (py-grpc answered an unknown
    method UNIMPLEMENTED before checking the token); with it, an unknown method is UNIMPLEMENTED."""
    if server.transport != "grpc":
        pytest.skip("gRPC methods")
    with secure_channel(server, creds.cert) as ch:
        unknown = ch.unary_unary("/rmscore.v1.RewardModel/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as e:
            unknown(b"", timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value
        with pytest.raises(grpc.RpcError) as e:
            unknown(b"", metadata=[("authorization", "Bearer " + creds.token)], timeout=30)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, e.value


def test_health_needs_no_token(server, creds):
    if server.transport == "grpc":
        with secure_channel(server, creds.cert) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for service in ("", "rmscore.v1.RewardModel"):
                r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert r.status == health_pb2.HealthCheckResponse.SERVING
        # The metrics port stays plaintext and open (docs/deploy.md: keep it on a private network).
        assert "rmscore_requests_total" in httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    else:
        with httpx.Client(base_url=server.base_url, verify=launch.ssl_context(creds.cert), timeout=10) as h:
            assert h.get("/healthz").json() == {"status": "alive"}
            assert h.get("/readyz").status_code == 200
            assert "rmscore_requests_total" in h.get("/metrics").text
    assert launch.is_ready(server.kind, server.port, tls_ca_file=creds.cert)
    assert not launch.is_ready(server.kind, server.port)  # a plaintext probe gets nothing


def test_plaintext_call_to_tls_server_fails(server, creds):
    token = [("authorization", f"Bearer {creds.token}")]
    if server.transport == "grpc":
        with grpc.insecure_channel(server.target) as ch:
            with pytest.raises(grpc.RpcError) as e:
                pbg.RewardModelStub(ch).GetModelInfo(pb.GetModelInfoRequest(), metadata=token, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    else:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/v1/model", headers={"Authorization": token[0][1]}, timeout=10)


def test_certificate_is_verified(server, creds):
    """A client that trusts another certificate does not talk to the server."""
    if server.transport == "grpc":
        with secure_channel(server, creds.other_cert) as ch:
            with pytest.raises(grpc.RpcError) as e:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    else:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{server.base_url}/healthz", verify=launch.ssl_context(creds.other_cert), timeout=10)


def test_client_with_token_and_ca_gets_golden_scores(server, creds):
    with client_for(server, tls_ca_file=creds.cert, auth_token=creds.token, chunk_size=8) as c:
        assert c.health().serving
        assert c.info().name == "default"
        got = c.score_ids(GOLDEN_IDS)
        assert np.abs(np.array(got.scores) - GOLDEN_SCORES).max() <= TOL
        streamed = dict(c.stream(enumerate(GOLDEN_IDS)))
        assert np.abs(np.array([streamed[i] for i in range(len(GOLDEN_IDS))]) - GOLDEN_SCORES).max() <= TOL


def test_client_with_wrong_token_is_refused_once(server, creds):
    """UNAUTHENTICATED is final: raised at once as Unauthenticated, sent once, not retried."""
    before = unauthenticated_count(server)
    retry = RetryPolicy(max_attempts=5)
    with client_for(server, tls_ca_file=creds.cert, auth_token=creds.wrong_token_file.read_text(), retry=retry) as c:
        t0 = time.monotonic()
        with pytest.raises(Unauthenticated) as e:
            c.score_ids(GOLDEN_IDS[:3])
        assert time.monotonic() - t0 < 10
        assert (e.value.code, e.value.message, e.value.attempts, e.value.retryable) == \
            ("UNAUTHENTICATED", MESSAGE, 1, False)
        with pytest.raises(Unauthenticated):
            c.info()
        assert c.health().serving  # health needs no token
    assert unauthenticated_count(server) - before == 2


def test_cli_reads_the_token_file(server, creds, tmp_path):
    target = ["--target", server.target] + (["--http"] if server.transport == "http" else [])
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"tokens": ids}) + "\n" for ids in GOLDEN_IDS))
    p = subprocess.run(RMSCORE + ["score", *target, "--tls-ca-file", str(creds.cert), "--auth-token-file",
                                  str(creds.token_file), "--input", str(tmp_path / "in.jsonl"), "--output",
                                  str(tmp_path / "out.jsonl"), "--no-progress"],
                       capture_output=True, text=True, timeout=120, cwd=servers.ROOT)
    assert p.returncode == 0, p.stderr
    scores = [json.loads(x)["score"] for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert np.abs(np.array(scores) - GOLDEN_SCORES).max() <= TOL
    assert creds.token not in p.stdout + p.stderr
    p = subprocess.run(RMSCORE + ["info", *target, "--tls-ca-file", str(creds.cert), "--json"],
                       capture_output=True, text=True, timeout=120, cwd=servers.ROOT)
    info = json.loads(p.stdout)
    assert p.returncode == 1 and info["error"] == f"UNAUTHENTICATED: {MESSAGE}" and info["health"].startswith("SERVING")


# ---- a plaintext+token server for each credentials path ----------------------------------

@pytest.mark.parametrize("kind", PLAIN_KINDS)
def test_token_without_tls(kind, creds):
    s = servers.start(kind, auth_token_file=creds.token_file)
    try:
        if s.transport == "grpc":
            with grpc.insecure_channel(s.target) as ch:
                grpc_refusals(ch, None)
                grpc_refusals(ch, [("authorization", "Bearer " + creds.wrong_token_file.read_text())])
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert r.status == health_pb2.HealthCheckResponse.SERVING
        else:
            http_refusals(s.base_url, True, {})
            assert httpx.get(f"{s.base_url}/readyz", timeout=10).status_code == 200
            # A client that waits for 100 Continue before its body is told the connection closes:
            # otherwise the server waited for that body and took the next request on it as the body.
            head, closed = harness.expect_continue_refused(s.port, "/rmscore/v1/score")
            assert head.startswith(b"HTTP/1.1 401 ") and b"connection: close" in head.lower(), head
            assert closed, "the connection stayed open after the 401"
        with client_for(s, auth_token=creds.token) as c:
            assert np.abs(np.array(c.score_ids(GOLDEN_IDS).scores) - GOLDEN_SCORES).max() <= TOL
            assert c.info().name == "default"
    finally:
        s.stop()
