"""--max-text-chars (server_py/rmscore/core/config.py, "text bounds"; docs/contract.md, "Input bounds"):
checked at start with the bad value quoted, parsed from the command line, defaulted from the model."""

from __future__ import annotations

import argparse

import pytest

from rmscore.core import config
from rmscore.core.config import ServeConfig
from test_config import error_of, model  # noqa: F401 - the fixture, shared


@pytest.mark.parametrize("value", [0, -5, 2.5, True])
def test_bad_max_text_chars_is_refused_with_its_value(model, value):  # noqa: F811
    assert error_of(model, max_text_chars=value) == \
        f"--max-text-chars: must be an integer >= 1 (default: 256 x the model's max_sequence_length), got {value!r}"


def test_max_text_chars_from_the_command_line(model):  # noqa: F811
    p = argparse.ArgumentParser()
    config.add_arguments(p)
    assert config.from_args(p.parse_args(["--model", str(model), "--max-text-chars", "4096"])).max_text_chars == 4096
    # None: the core sizes it from the model's window (core/tokenizing.py default_max_text_chars).
    assert config.from_args(p.parse_args(["--model", str(model)])).max_text_chars is None
    assert ServeConfig(model=model, transport="grpc", max_text_chars=1).max_text_chars == 1
