"""Same flags, same eager validation in every server: a bad value exits 2 at once, quoting it."""

from __future__ import annotations

import subprocess

import pytest

import servers

KINDS = [k for k in ("cpp-grpc", "py-grpc-onnxruntime", "py-http-onnxruntime") if k in servers.available_kinds()]
BAD = [
    (dict(max_batch_size=0), "--max-batch-size: must be >= 1, got 0"),
    (dict(intra_op_threads=0), "--intra-op-threads: must be >= 1, got 0"),
    (dict(max_queue_delay_ms=-1), "--max-queue-delay-ms: must be >= 0, got -1"),
    (dict(max_batch_ms=-1), "--max-batch-ms: must be >= 0 and <= 2147483000, got -1"),
    (dict(max_batch_ms=3e9), "--max-batch-ms: must be >= 0 and <= 2147483000, got 3000000000.0"),
    (dict(port=70000), "--port: must be"),
    (dict(batching="lifo"), "--batching: must be one of"),
    # Python quotes the parsed float ("got 0.0"), C++ the flag as typed ("got 0"): both start so.
    (dict(drain_grace_seconds=0), "--drain-grace-seconds: must be > 0, got 0"),
    (dict(max_connection_age_seconds=0), "--max-connection-age-seconds: must be > 0 and <= 2147483, got 0"),
    (dict(max_connection_age_grace_seconds=-1),
     "--max-connection-age-grace-seconds: must be >= 0 and <= 2147483, got -1"),
    (dict(max_queue_sequences=100, max_sequences_per_request=101),
     "--max-sequences-per-request: must be <= --max-queue-sequences (100), got 101"),
    (dict(model_workers=2, intra_op_threads=1),
     "--model-workers: each worker needs an intra-op thread: must be <= --intra-op-threads (1), got 2"),
    (dict(cost_profile_seconds=0), "--cost-profile-seconds: must be > 0, got 0"),
    (dict(cost_profile_dir="/proc/cpuinfo"),
     "--cost-profile-dir: must be a directory (created when missing) or none, got '/proc/cpuinfo'"),
    (dict(body_timeout_seconds=0), "--body-timeout-seconds: must be > 0 and <= 2147483, got 0"),
    (dict(liveness_stall_seconds=-1), "--liveness-stall-seconds: must be >= 0 and <= 2147483, got -1"),
    (dict(max_request_bytes=2048, max_buffered_request_bytes=1024),
     "--max-buffered-request-bytes: must be >= --max-request-bytes (2048), got 1024"),
    (dict(max_queued_request_bytes=0), "--max-queued-request-bytes: must be >= 1, got 0"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flags,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_flag_exits_with_the_value_quoted(kind, flags, message):
    p = subprocess.run(servers.command(kind, **{"port": 0, **flags}), capture_output=True, text=True, timeout=120,
                       cwd=servers.ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and message in out, out


# ---- access control: TLS files go together, every file must be readable, the token file holds one --------
ACCESS_KINDS = servers.available_kinds()  # config checks are cheap: no server loads a model before they pass


def access_case(case: str, d) -> tuple[dict, str]:
    cert, key, blank = d / "cert.pem", d / "key.pem", d / "blank-token"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")  # only readability is checked at config time
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    blank.write_text(" \n\t\n")
    spaced = d / "spaced-token"
    spaced.write_text("two words\n")
    missing = d / "missing" / "file"
    return {
        "cert without key": (dict(tls_cert_file=cert),
                             f"--tls-cert-file: needs --tls-key-file too (TLS takes both or neither), got '{cert}'"),
        "key without cert": (dict(tls_key_file=key),
                             f"--tls-key-file: needs --tls-cert-file too (TLS takes both or neither), got '{key}'"),
        "missing cert": (dict(tls_cert_file=missing, tls_key_file=key),
                         f"--tls-cert-file: cannot read the file, got '{missing}'"),
        "missing key": (dict(tls_cert_file=cert, tls_key_file=missing),
                        f"--tls-key-file: cannot read the file, got '{missing}'"),
        "missing token file": (dict(auth_token_file=missing), f"--auth-token-file: cannot read the file, got '{missing}'"),
        "blank token file": (dict(auth_token_file=blank), f"--auth-token-file: the file holds no token, got '{blank}'"),
        "token with a space": (dict(auth_token_file=spaced),
                               f"--auth-token-file: the token must be printable ASCII without spaces, got '{spaced}'"),
        "empty path": (dict(auth_token_file=""), "--auth-token-file: must not be empty"),
    }[case]


@pytest.mark.parametrize("kind", ACCESS_KINDS)
@pytest.mark.parametrize("case", ["cert without key", "key without cert", "missing cert", "missing key",
                                  "missing token file", "blank token file", "token with a space", "empty path"])
def test_access_flags_checked_at_start(kind, case, tmp_path):
    flags, message = access_case(case, tmp_path)
    p = subprocess.run(servers.command(kind, **{"port": 0, **flags}), capture_output=True, text=True, timeout=120,
                       cwd=servers.ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and message in out, out
