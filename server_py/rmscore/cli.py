"""The `rmscore` command: export, serve, score, info, bench, up."""

from __future__ import annotations

import argparse
import importlib
import sys


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
    for extra in ("rmscore.server.cli", "rmscore.stack", "rmscore.client.cli", "rmscore.bench.cli"):
        try:
            module = importlib.import_module(extra)
        except ModuleNotFoundError as e:
            # A missing dependency is an error; an absent component (or its parent package) is not.
            if e.name != extra and not extra.startswith(f"{e.name}."):
                raise
            continue
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "export":
        from .export import main as export_main
        return export_main(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
