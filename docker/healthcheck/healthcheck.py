"""Container health check for the Python images: exit 0 when the server is ready (and, asked, live).

    healthcheck.py grpc [HOST:PORT [SERVICE]...] [--service NAME]...
        grpc.health.v1 Check == SERVING for every service named (default: "", readiness)
    healthcheck.py http [URL]...
        GET each URL (default /readyz) answers 200

The rmscore servers answer "" / /readyz for readiness and "liveness" / /livez for a batcher that makes
progress (docs/contract.md). A check that must see both names both: `grpc 127.0.0.1:50051 --service ""
--service liveness`, `http http://127.0.0.1:8000/readyz http://127.0.0.1:8000/livez`. `-service NAME`
and `--service=NAME` work too, as in grpc_health_probe (docker/healthcheck/grpc_health_probe.cc).

Uses only what the image's venv already has (grpcio-health-checking, httpx);
nothing is downloaded at run time. Exit 1 when not ready or unreachable.
"""

from __future__ import annotations

import sys


def check_grpc(target: str, service: str, timeout_s: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    who = target + (f' service "{service}"' if service else "")
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            print(f"{who}: {e.code().name} {e.details()}")
            return False
    print(f"{who}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def check_http(url: str, timeout_s: float) -> bool:
    import httpx

    try:
        code = httpx.get(url, timeout=timeout_s).status_code
    except httpx.HTTPError as e:
        print(f"{url}: {e!r}")
        return False
    print(f"{url}: {code}")
    return code == 200


def split_services(args: list[str]) -> tuple[list[str], list[str]]:
    """(the words left, the services named by --service NAME / --service=NAME / -service ...)."""
    rest, services = [], []
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag in ("--service", "-service"):
            if not eq:
                i += 1
                if i == len(args):
                    raise SystemExit(f"healthcheck.py: {flag} needs a value")
                value = args[i]
            services.append(value)
        else:
            rest.append(args[i])
        i += 1
    return rest, services


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("grpc", "http"):
        print(__doc__)
        return 2
    kind = argv[0]
    rest, services = split_services(argv[1:])
    if kind == "grpc":
        target = rest[0] if rest else "127.0.0.1:50051"
        names = rest[1:] + services or [""]  # words after the target are services too, as in grpc_health_probe
        ok = all(check_grpc(target, name, 2.0) for name in names)
    else:
        ok = all(check_http(url, 2.0) for url in rest or ["http://127.0.0.1:8000/readyz"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
