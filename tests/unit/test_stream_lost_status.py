"""A ScoreStream call whose status grpcio lost under a write is reopened, not failed.

grpcio's asyncio client reads "Internal error from Core" (INTERNAL) when a write fails because the
server ended the call, e.g. a draining replica's UNAVAILABLE; the stream must then move, as it does
on UNAVAILABLE. Any other INTERNAL is the server's own and stays final."""

import grpc
from grpc.aio import AioRpcError, Metadata

from rmscore_client.streaming import _stream_error


def _err(code, details):
    return AioRpcError(code, Metadata(), Metadata(), details=details)


def test_lost_status_under_a_write_reopens_the_stream():
    err = _stream_error(_err(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert err.code == "UNAVAILABLE" and err.retryable


def test_a_servers_internal_error_stays_final():
    err = _stream_error(_err(grpc.StatusCode.INTERNAL, "batch failed: onnxruntime error"))
    assert err.code == "INTERNAL" and not err.retryable


def test_other_codes_map_as_before():
    assert _stream_error(_err(grpc.StatusCode.UNAVAILABLE, "not ready: draining")).code == "UNAVAILABLE"
    assert _stream_error(_err(grpc.StatusCode.INVALID_ARGUMENT, "bad")).code == "INVALID_ARGUMENT"
