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
    (dict(port=70000), "--port: must be"),
    (dict(batching="lifo"), "--batching: must be one of"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flags,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_flag_exits_with_the_value_quoted(kind, flags, message):
    p = subprocess.run(servers.command(kind, **{"port": 0, **flags}), capture_output=True, text=True, timeout=120,
                       cwd=servers.ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and message in out, out
