"""Container health check for the Python images: exit 0 when the server is ready.

    healthcheck.py grpc [HOST:PORT] [--service NAME]   grpc.health.v1 Check == SERVING
    healthcheck.py http [URL]                         GET URL (default /readyz) answers 200

Uses only what the image's venv already has (grpcio-health-checking, httpx);
nothing is downloaded at run time. Exit 1 when not ready or unreachable.
"""

from __future__ import annotations

import sys


def check_grpc(target: str, service: str, timeout_s: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            print(f"{target}: {e.code().name} {e.details()}")
            return False
    print(f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("grpc", "http"):
        print(__doc__)
        return 2
    kind, rest = argv[0], argv[1:]
    service = ""
    if "--service" in rest:
        i = rest.index("--service")
        service = rest[i + 1]
        rest = rest[:i] + rest[i + 2:]
    if kind == "grpc":
        ok = check_grpc(rest[0] if rest else "127.0.0.1:50051", service, 2.0)
    else:
        ok = check_http(rest[0] if rest else "http://127.0.0.1:8000/readyz", 2.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
