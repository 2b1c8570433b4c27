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


def test_shutdown_reserve_is_three_seconds_at_most_and_half_the_grace_at_least(model):
    assert ServeConfig(model=model).shutdown_reserve_s == 3.0
    assert ServeConfig(model=model, drain_grace_seconds=4).shutdown_reserve_s == 2.0
    assert ServeConfig(model=model, drain_grace_seconds=6).shutdown_reserve_s == 3.0
