"""`rmscore serve`: one of the Python servers (gRPC or HTTP) on one backend."""

from __future__ import annotations

from rmscore.core.config import ConfigError, add_arguments, from_args


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="run a Python scoring server (gRPC or FastAPI)")
    add_arguments(p)
    p.set_defaults(func=serve)


def serve(args) -> int:
    try:
        cfg = from_args(args)
    except ConfigError as e:
        print(f"rmscore serve: error: {e}", flush=True)
        return 2
    if cfg.transport == "grpc":
        from rmscore.frontends.grpc_server import run
    else:
        from rmscore.frontends.http_server import run
    try:
        return run(cfg)
    except ConfigError as e:  # what only the model repository can tell, e.g. a cost profile for another model
        print(f"rmscore serve: error: {e}", flush=True)
        return 2
