"""What the conformance suite shares: the default model's golden data, and one way to call any server kind.

`Caller(server)` is rmscore_tools.caller's `Caller` (the one caller of every server-driving tool)
aimed at a RunningServer: requests are plain dicts ({"tokens": [...]} / {"prompt": .., "response":
..} / {}), and every failure comes back as CallError(code name, message), whatever the transport,
so one assertion covers gRPC and HTTP alike.
"""

from __future__ import annotations

import json
import pathlib
import socket

import numpy as np

from rmscore_client.v1 import reward_pb2 as pb  # noqa: F401 - re-exported for the tests
from rmscore_client.v1 import reward_pb2_grpc as pbg  # noqa: F401 - re-exported for the tests
from rmscore_tools import caller
from rmscore_tools.caller import CallError  # noqa: F401 - re-exported for the tests

ROOT = pathlib.Path(__file__).resolve().parents[1]
MANIFEST = json.loads((ROOT / "models" / "default" / "manifest.json").read_text())
GOLDEN_IDS = [g["input_ids"] for g in MANIFEST["golden"]]
GOLDEN_SCORES = np.array([g["score"] for g in MANIFEST["golden"]])
VOCAB = MANIFEST["vocab_size"]
MAX_LEN = MANIFEST["max_sequence_length"]


class Caller(caller.Caller):
    """The shared caller, built from a RunningServer (tests/servers.py)."""

    def __init__(self, server):
        super().__init__(server.transport, caller.target_of(server))
        self.server = server


def expect_continue_refused(port: int, path: str, length: int = 1000) -> tuple[bytes, bool]:
    """Headers of a POST announcing `length` bytes with `Expect: 100-continue`, and no body: (the answer's
    head, whether the server closed the connection after it within 5 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (path.encode(), length))
        answer = b""
        try:
            while chunk := sock.recv(1 << 16):
                answer += chunk
        except TimeoutError:
            return answer.partition(b"\r\n\r\n")[0], False
    return answer.partition(b"\r\n\r\n")[0], True
