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


def bearer_matches(header_value: str | bytes | None, token: str) -> bool:
    """Whether an authorization value is `Bearer <token>`, compared in constant time."""
    if header_value is None:
        return False
    if isinstance(header_value, str):
        header_value = header_value.encode("latin-1", "replace")
    return hmac.compare_digest(header_value, b"Bearer " + token.encode("ascii"))


def invalid(message: str) -> ScoreError:
    return ScoreError(Code.INVALID_ARGUMENT, message)
