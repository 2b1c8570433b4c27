"""`AsyncRewardClient`: the asyncio client over gRPC (any server kind), replicas balanced by gRPC."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import grpc

from .base import _AsyncClientBase, check_token, read_ca
from .errors import from_rpc_error
from .policy import with_retry
from .streaming import GrpcStream
from .types import Health, ModelInfo

SERVICE_NAME = "rmscore.v1.RewardModel"


def service_config(load_balancing: str = "round_robin", health_check: bool = True) -> str:
    """gRPC service config: the channel balances over every address the target resolves to
    (`ipv4:h1:p1,h2:p2`, a DNS name with several A records, ...), and with `health_check`
    only sends to replicas whose health service says SERVING (a draining replica drops out)."""
    cfg: dict = {"loadBalancingConfig": [{load_balancing: {}}]}
    if health_check:
        cfg["healthCheckConfig"] = {"serviceName": SERVICE_NAME}
    return json.dumps(cfg)


class _LazyTrunc(dict):
    """Truncation name -> proto enum, filled on first use (the stubs load only when gRPC is used)."""

    def __missing__(self, key):
        from rmscore_client.v1 import reward_pb2 as pb

        self.update({"none": pb.TRUNCATION_NONE, "left": pb.TRUNCATION_LEFT, "right": pb.TRUNCATION_RIGHT})
        return self[key]


_TRUNC_PB = _LazyTrunc()


class AsyncRewardClient(_AsyncClientBase):
    """asyncio gRPC client of the RewardModel service.

    `target`: any gRPC target: `127.0.0.1:50051`, `ipv4:127.0.0.1:5001,127.0.0.1:5002`
    (several replicas), `dns:///rm.internal:50051`. Requests are spread over the replicas by
    gRPC's own `round_robin` policy. Use one client per event loop.

    Access control (docs/contract.md): `tls=True` speaks TLS, verified against the system's
    roots or, with `tls_ca_file` (which implies `tls`), against that PEM file alone;
    `auth_token` is sent as `authorization: Bearer <token>` on every call but health. A refused
    token raises `Unauthenticated`, never retried."""

    def __init__(self, target: str, *, load_balancing: str = "round_robin", health_check: bool = True,
                 channel_options: Sequence[tuple[str, Any]] = (), tls: bool = False,
                 tls_ca_file: str | os.PathLike | None = None, auth_token: str | None = None, **kw):
        super().__init__(**kw)
        self.target = target
        self.tls = bool(tls or tls_ca_file)
        self._root_certs = read_ca(tls_ca_file) if tls_ca_file else None
        token = check_token(auth_token)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._options = [
            ("grpc.service_config", service_config(load_balancing, health_check)),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            # A restarted replica rejoins within ~2 s instead of gRPC's default (up to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
            ("grpc.keepalive_time_ms", 30_000),
        ]
        given = {k for k, _ in channel_options}
        self._options = [o for o in self._options if o[0] not in given] + list(channel_options)
        self._channel: grpc.aio.Channel | None = None
        self._stub = None

    def _rpc(self):
        if self._channel is None:
            from rmscore_client.v1 import reward_pb2_grpc

            if self.tls:
                creds = grpc.ssl_channel_credentials(root_certificates=self._root_certs)
                self._channel = grpc.aio.secure_channel(self.target, creds, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = reward_pb2_grpc.RewardModelStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _score_once(self, seqs, truncation, timeout_s):
        from rmscore_client.v1 import reward_pb2 as pb

        req = pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=s)) for s in seqs],
                              truncation=_TRUNC_PB[truncation])
        try:
            r = await self._rpc().Score(req, timeout=timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        t = r.timings
        return list(r.scores), r.model_version, (t.total_ms, t.inference_ms, t.queue_ms)

    async def info(self) -> ModelInfo:
        """The model behind the target (from one replica), tokenizer JSON included."""
        from rmscore_client.v1 import reward_pb2 as pb

        async def once(left):
            try:
                return await self._rpc().GetModelInfo(pb.GetModelInfoRequest(), timeout=left,
                                                      metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                raise from_rpc_error(e) from None

        m, _ = await with_retry(once, self.timeout_s, self.retry)
        fields = {name: getattr(m, name) for name in ModelInfo.__dataclass_fields__}
        fields["special_tokens"] = dict(fields["special_tokens"])
        return ModelInfo(**fields)

    async def _tokenizer_json(self) -> str:
        return (await self.info()).tokenizer_json

    async def health(self) -> Health:
        """The standard gRPC health check for the RewardModel service (one replica answers). Never
        raises for an unhealthy or unreachable server: the answer says why."""
        try:
            from grpc_health.v1 import health_pb2, health_pb2_grpc
        except ImportError as e:  # a dependency of rmscore-client, but an environment can lack it
            return Health(False, f"cannot check: {e.name or 'grpc_health'} is not installed "
                                 "(pip install grpcio-health-checking)")

        self._rpc()
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            r = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                                 timeout=min(self.timeout_s or 5.0, 5.0))
        except grpc.aio.AioRpcError as e:
            # With the health check on, a replica that is up but NOT_SERVING is not picked either.
            return Health(False, f"no serving replica reachable: {e.code().name}: {e.details()}")
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        return Health(status == "SERVING", status)

    def _stream(self, items, truncation, errors, timeout_s):
        return GrpcStream(self, items, _TRUNC_PB[truncation], errors, timeout_s).run()
