"""The transport-limit flags (server_py/rmscore/core/config.py; docs/hardening.md, "Transport attacks
(Python)"): checked at start, the bad value quoted, and parsed from the command line. The C++ server is to
take the same flags."""

from __future__ import annotations

import argparse

import pytest

from rmscore.core import config
from rmscore.core.config import ServeConfig
from test_config import error_of, model  # noqa: F401 - the fixture, shared


@pytest.mark.parametrize("flags, message", [
    (dict(max_concurrent_streams=0), "--max-concurrent-streams: must be >= 1, got 0"),
    (dict(max_stream_items_in_flight=0), "--max-stream-items-in-flight: must be >= 1, got 0"),
    (dict(body_timeout_seconds=0.0), "--body-timeout-seconds: must be > 0 and <= 2147483, got 0.0"),
    (dict(max_request_bytes=1024, max_buffered_request_bytes=1023),
     "--max-buffered-request-bytes: must be >= --max-request-bytes (1024), got 1023"),
])
def test_bad_transport_limit_is_refused_with_its_value(model, flags, message):  # noqa: F811
    assert error_of(model, **flags) == message


def test_transport_limits_from_the_command_line(model):  # noqa: F811
    p = argparse.ArgumentParser()
    config.add_arguments(p)
    cfg = config.from_args(p.parse_args(["--model", str(model), "--max-concurrent-streams", "7",
                                         "--max-stream-items-in-flight", "3", "--body-timeout-seconds", "1.5",
                                         "--max-buffered-request-bytes", str(64 << 20)]))
    assert (cfg.max_concurrent_streams, cfg.max_stream_items_in_flight, cfg.body_timeout_seconds,
            cfg.max_buffered_request_bytes) == (7, 3, 1.5, 64 << 20)
    assert ServeConfig(model=model).max_buffered_request_bytes == 128 << 20
