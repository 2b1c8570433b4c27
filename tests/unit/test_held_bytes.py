"""--max-queued-request-bytes (issue 29, defect 1): the bytes of accepted requests held until answered,
core/admission.py HeldBytes, and its flag (core/config.py). server_cpp/tests/test_held_bytes.cc holds the
C++ server to the same rule and message."""

from __future__ import annotations

import argparse

from rmscore.core import config
from rmscore.core.admission import HeldBytes, request_bytes
from rmscore.core.config import ServeConfig
from rmscore.core.errors import Code
from test_config import error_of, model  # noqa: F401 - the fixture, shared


def test_request_bytes_counts_ids_as_int64_and_text_by_character():
    assert request_bytes(512) == 4096
    assert request_bytes(0, 10) == 10
    assert request_bytes(3, 5) == 29


def test_a_request_past_the_budget_is_refused_with_the_figures_and_counts_nothing():
    held = HeldBytes(1000)
    assert held.hold(600) is None
    refused = held.hold(401)
    assert refused.code == Code.RESOURCE_EXHAUSTED
    assert refused.message == ("queue full: 600 bytes of accepted requests held, plus this request's 401, "
                               "exceeds max_queued_request_bytes 1000")
    assert held.held == 600
    assert held.hold(400) is None  # exactly at the budget fits
    assert held.held == 1000


def test_released_bytes_make_room_again():
    held = HeldBytes(1000)
    assert held.hold(1000) is None
    assert held.hold(1) is not None
    held.release(1000)
    assert held.held == 0
    assert held.hold(1) is None


def test_an_idle_server_accepts_one_request_larger_than_the_budget():
    held = HeldBytes(1000)
    assert held.hold(5000) is None  # else it would be refused "queue full" forever
    assert held.hold(1) is not None
    held.release(5000)
    assert held.hold(1) is None


def test_flag_is_checked_eagerly_and_parsed(model):  # noqa: F811
    assert error_of(model, max_queued_request_bytes=0) == "--max-queued-request-bytes: must be >= 1, got 0"
    p = argparse.ArgumentParser()
    config.add_arguments(p)
    cfg = config.from_args(p.parse_args(["--model", str(model), "--max-queued-request-bytes", str(2 << 20)]))
    assert cfg.max_queued_request_bytes == 2 << 20
    assert ServeConfig(model=model).max_queued_request_bytes == 1 << 30
