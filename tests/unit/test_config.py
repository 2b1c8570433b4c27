"""The Python servers' flag checks that server_cpp/tests/test_config.cc holds the C++ server to: the
same rules, the same messages quoting the bad value, the same shutdown reserve."""

from __future__ import annotations

import pathlib

import pytest

from rmscore.core.config import ConfigError, ServeConfig


@pytest.fixture
def model(tmp_path) -> pathlib.Path:
    (tmp_path / "manifest.json").write_text("{}")  # only its presence is checked at config time
    return tmp_path


def error_of(model: pathlib.Path, **flags) -> str:
    with pytest.raises(ConfigError) as e:
        ServeConfig(model=model, **flags)
    return str(e.value)


def test_drain_grace_must_be_positive(model):
    assert error_of(model, drain_grace_seconds=0.0) == "--drain-grace-seconds: must be > 0, got 0.0"
    assert error_of(model, drain_grace_seconds=-2.0) == "--drain-grace-seconds: must be > 0, got -2.0"
    assert ServeConfig(model=model, drain_grace_seconds=0.5).drain_grace_seconds == 0.5


def test_per_request_limit_must_fit_the_queue(model):
    assert (error_of(model, max_queue_sequences=100, max_sequences_per_request=101)
            == "--max-sequences-per-request: must be <= --max-queue-sequences (100), got 101")
    assert ServeConfig(model=model, max_queue_sequences=100, max_sequences_per_request=100)
    # The HTTP server reads no JSON list of more than 65536 items (frontends/body_lists.py).
    big = dict(max_queue_sequences=70_000, max_sequences_per_request=65_537)
    assert (error_of(model, transport="http", **big) == "--max-sequences-per-request: must be <= 65536 on the "
            "HTTP server, which reads a JSON list of no more items, got 65537")
    assert ServeConfig(model=model, **big).max_sequences_per_request == 65_537  # gRPC: no JSON


def test_shutdown_reserve_is_three_seconds_at_most_and_half_the_grace_at_least(model):
    assert ServeConfig(model=model).shutdown_reserve_s == 3.0
    assert ServeConfig(model=model, drain_grace_seconds=4).shutdown_reserve_s == 2.0
    assert ServeConfig(model=model, drain_grace_seconds=6).shutdown_reserve_s == 3.0


def test_max_connection_age_must_be_positive_and_fit_grpcs_milliseconds(model):
    assert (error_of(model, max_connection_age_seconds=0.0)
            == "--max-connection-age-seconds: must be > 0 and <= 2147483, got 0.0")
    assert (error_of(model, max_connection_age_seconds=2147484.0)
            == "--max-connection-age-seconds: must be > 0 and <= 2147483, got 2147484.0")
    assert (error_of(model, max_connection_age_grace_seconds=-1.0)
            == "--max-connection-age-grace-seconds: must be >= 0 and <= 2147483, got -1.0")


def test_connection_age_flags_become_grpc_channel_arguments_in_milliseconds(model):
    assert dict(ServeConfig(model=model).connection_age_options) == {
        "grpc.max_connection_age_ms": 300_000, "grpc.max_connection_age_grace_ms": 30_000}
    tiny = ServeConfig(model=model, max_connection_age_seconds=0.0001, max_connection_age_grace_seconds=0)
    assert dict(tiny.connection_age_options) == {"grpc.max_connection_age_ms": 1, "grpc.max_connection_age_grace_ms": 0}
