"""The `rmscore` command. The server's own subcommands (export, serve) are built in, so they work
from a source tree too; the other distributions add theirs through the `rmscore.commands` entry
points (score and info from rmscore-client; up, bench and hardening from rmscore-loadtest)."""

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
    p.add_argument("--int8", action="store_true", help="also write a dynamically quantized int8 graph")


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
