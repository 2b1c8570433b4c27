"""Command-line pieces the tools' subcommands share (`rmscore bench`, `rmscore hardening`)."""

from __future__ import annotations

import argparse


def comma_list(conv=str):
    def parse(text: str):
        items = [x.strip() for x in text.split(",") if x.strip()]
        try:
            return tuple(conv(x) for x in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
    return parse
