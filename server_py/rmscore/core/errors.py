"""One error type for the whole core, mapped once per transport (gRPC status, HTTP status)."""

from __future__ import annotations

import enum
import hmac

import grpc


class Code(enum.Enum):
    INVALID_ARGUMENT = (grpc.StatusCode.INVALID_ARGUMENT, 422)
    RESOURCE_EXHAUSTED = (grpc.StatusCode.RESOURCE_EXHAUSTED, 429)
    UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, 503)
    DEADLINE_EXCEEDED = (grpc.StatusCode.DEADLINE_EXCEEDED, 504)
    CANCELLED = (grpc.StatusCode.CANCELLED, 499)
    INTERNAL = (grpc.StatusCode.INTERNAL, 500)
    UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, 401)

    @property
    def grpc(self) -> grpc.StatusCode:
        return self.value[0]

    @property
    def http(self) -> int:
        return self.value[1]

    @property
    def number(self) -> int:
        """The google.rpc.Code number, as carried in ScoreStreamResponse.error.code."""
        return self.value[0].value[0]


class ScoreError(Exception):
    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ScoreError({self.code.name}, {self.message!r})"


# The refusal of a call without the right token, the same text in every server (docs/contract.md).
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token"


def bearer_matches(header_values: list[str | bytes], token: str) -> bool:
    """Whether a call's authorization values are exactly one `Bearer <token>`, the scheme in any case
    (RFC 7235) and the token compared in constant time. Two values are refused: which one would count
    differed between servers (the C++ one took the last, Python the first). server_cpp's BearerMatches."""
    if len(header_values) != 1:
        return False
    value = header_values[0]
    if isinstance(value, str):
        value = value.encode("latin-1", "replace")
    scheme_ok = value[:7].lower() == b"bearer "
    return hmac.compare_digest(value[7:], token.encode("ascii")) and scheme_ok


def invalid(message: str) -> ScoreError:
    return ScoreError(Code.INVALID_ARGUMENT, message)
