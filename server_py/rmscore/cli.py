"""The `rmscore` command. The server's own subcommands (export, serve) are built in, so they work
from a source tree too; the other distributions add theirs through the `rmscore.commands` entry
points (score and info from rmscore-client; up, bench, profile and hardening from rmscore-tools)."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from rmscore.frontends.cli import add_parsers as serve_parser


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="write a model repository (ONNX graph, checkpoint, tokenizer, manifest)")
    p.add_argument("--model", help="local Hugging Face checkpoint directory (default: the embedded MiniLM reward model)")
    p.add_argument("--name", default="default", help="repository name: writes OUTPUT/NAME (default: %(default)s)")
    p.add_argument("--output", default="models", help="models root directory (default: %(default)s)")
    from rmscore.model import precision

    p.add_argument("--int8", action="store_true",
                   help="also write an int8 graph, if it passes the ranking gate (docs/precision.md)")
    p.add_argument("--int8-recipe", choices=precision.INT8_RECIPES, default=precision.DEFAULT_INT8_RECIPE,
                   help="how to quantize (default: %(default)s)")
    p.add_argument("--gate-spearman", type=float, default=precision.DEFAULT_MIN_SPEARMAN,
                   help="least Spearman vs fp32 on the held-out pairs (default: %(default)s)")
    p.add_argument("--gate-pairwise", type=float, default=precision.DEFAULT_MIN_PAIRWISE,
                   help="least pairwise order agreement vs fp32 (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmscore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _export_parser(sub)
    serve_parser(sub)
    for ep in sorted(entry_points(group="rmscore.commands"), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "export":
        from rmscore.model.export import main as export_main
        return export_main(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
