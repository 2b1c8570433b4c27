"""uvicorn's h11 connection with a deadline on request headers.

uvicorn arms no timer while a request's headers arrive: its keep-alive timer starts only after a
response and is cancelled by any byte received, so a client that sends its headers a byte every
few seconds, or opens a connection and sends nothing, holds the connection (and its buffers) for
as long as it likes; many such clients exhaust the server's sockets (slowloris). Here the request
line and headers must be complete within `timeout_s` of the connection opening or of the previous
response completing (and so must the rest of a body answered before it was read, a refusal for
overload: http_middleware.RefuseBeforeBody); otherwise the connection is closed. The body has its own deadline
(http_middleware.BodyBudget), with the same number of seconds.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class _HeaderDeadlineProtocol(H11Protocol):
    header_timeout_s: float  # set on the subclass `with_header_deadline` makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_timer: asyncio.TimerHandle | None = None
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._clear_headers_timer()
        super().connection_lost(exc)

    def _waiting(self) -> bool:
        """h11 waits for a request's headers (their state IDLE), or for the rest of a body whose
        answer is complete (http_middleware.RefuseBeforeBody answers before reading it; uvicorn drops
        the rest as it comes, and any byte cancels its keep-alive timer)."""
        answered_early = self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY
        return (self.conn.their_state is h11.IDLE or answered_early) and not self.transport.is_closing()

    def _watch_headers(self) -> None:
        """Armed while `_waiting`, cleared once the headers came; not re-armed while the rest of an
        answered body and then the next headers arrive: both are due `timeout_s` after the answer."""
        waiting = self._waiting()
        if waiting and self._headers_timer is None:
            self._headers_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)
        elif not waiting:
            self._clear_headers_timer()

    def _clear_headers_timer(self) -> None:
        if getattr(self, "_headers_timer", None) is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _headers_late(self) -> None:
        self._headers_timer = None
        if self._waiting():
            # No answer: the client has not sent a request to answer, and an idle keep-alive
            # connection is closed the same way by uvicorn's own timer.
            self.transport.close()


def with_header_deadline(timeout_s: float) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...): h11 with request headers due in `timeout_s`."""
    if not timeout_s > 0:
        raise ValueError(f"header timeout must be > 0 s, got {timeout_s!r}")
    return type("HeaderDeadlineH11Protocol", (_HeaderDeadlineProtocol,), {"header_timeout_s": float(timeout_s)})
