"""Typed errors: every failure a client call can raise is a `RewardServerError`.

`.code` is the gRPC status name (the HTTP client maps its JSON error body and
status to the same names), `.message` the server's message, which names the
field and quotes the bad value (see docs/contract.md).
"""

from __future__ import annotations

import re

import grpc

RETRYABLE = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})


class RewardServerError(Exception):
    """A call failed; `.code` is the status name (e.g. "INVALID_ARGUMENT"), `.message` the reason."""

    code: str = "UNKNOWN"

    def __init__(self, code: str, message: str, *, attempts: int = 1, item_id=None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        #: How many times the call was sent before this error was final.
        self.attempts = attempts
        #: In `stream(...)`, the caller's id of the item that failed.
        self.item_id = item_id

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


class InvalidInput(RewardServerError):
    """INVALID_ARGUMENT: the request is wrong (bad token id, too long, empty...). Never retried."""


class Overloaded(RewardServerError):
    """RESOURCE_EXHAUSTED: the server's queue is full. Retried with backoff."""


class MessageTooLarge(RewardServerError):
    """RESOURCE_EXHAUSTED because one message exceeds the size limit: not transient, never retried
    (use a smaller `chunk_size`). Over HTTP the status says so (413); over gRPC the transport refuses
    the message before any server code runs, so its status (`from_rpc_error`) is all there is."""

    @property
    def retryable(self) -> bool:
        return False


class Unavailable(RewardServerError):
    """UNAVAILABLE: no replica reachable, warming up, or draining. Retried with backoff."""


class DeadlineExceeded(RewardServerError):
    """DEADLINE_EXCEEDED: the call's deadline passed before the scores were made. Not retried."""


class Cancelled(RewardServerError):
    """CANCELLED."""


class Unauthenticated(RewardServerError):
    """UNAUTHENTICATED (HTTP 401): the server wants a bearer token and got none or a wrong one
    (`auth_token`). Never retried: the same token would be refused again."""


class InternalError(RewardServerError):
    """INTERNAL / UNKNOWN: the model or server failed. Not retried."""


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidInput,
    "RESOURCE_EXHAUSTED": Overloaded,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "CANCELLED": Cancelled,
    "UNAUTHENTICATED": Unauthenticated,
    "INTERNAL": InternalError,
    "UNKNOWN": InternalError,
}

# Status numbers (google.rpc.Code) as carried in ScoreStreamResponse.error.code.
_BY_NUMBER = {sc.value[0]: sc.name for sc in grpc.StatusCode}


def error_for(code: str, message: str, **kw) -> RewardServerError:
    """The typed error for a status name: the code decides, never the message's text."""
    return _BY_CODE.get(code, RewardServerError)(code, message, **kw)


def again(err: RewardServerError, **kw) -> RewardServerError:
    """The same error with other attempts or item id: its class kept (a MessageTooLarge stays one),
    a bare RewardServerError given its code's."""
    cls = _BY_CODE.get(err.code, RewardServerError) if type(err) is RewardServerError else type(err)
    return cls(err.code, err.message, **{"attempts": err.attempts, "item_id": err.item_id, **kw})


# gRPC answers a message over a channel's or server's limit with RESOURCE_EXHAUSTED, the code of a
# full queue too, and nothing else structured (no trailer, no status detail): the transport refuses
# it before the server's code runs. Its wording is gRPC core's, "Received message larger than max
# (N vs. M)" ("Sent ..." for the client's own limit), which grpcio's server prefixes with "SERVER: ".
_GRPC_SIZE_REFUSAL = re.compile(r"\b(Received|Sent) message larger than max \(\d+ vs\. \d+\)")


def from_rpc_error(e: grpc.RpcError, **kw) -> RewardServerError:
    code = e.code()
    name = code.name if code is not None else "UNKNOWN"
    details = e.details() or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _GRPC_SIZE_REFUSAL.search(details):
        return MessageTooLarge(name, details, **kw)
    return error_for(name, details, **kw)


def from_status_number(number: int, message: str, **kw) -> RewardServerError:
    return error_for(_BY_NUMBER.get(number, "UNKNOWN"), message, **kw)
