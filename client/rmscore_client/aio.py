"""asyncio clients: `AsyncRewardClient` (gRPC) and `AsyncHttpRewardClient` (the FastAPI server).

Both share the scoring logic in `_AsyncClientBase` (base.py): a rollout of any size is
cut into chunks of `chunk_size` sequences, at most `max_concurrency` chunks are in
flight at once, every chunk has a deadline (`timeout_s`, retries included), and a
chunk that fails with UNAVAILABLE or RESOURCE_EXHAUSTED is re-sent after an
exponential, jittered backoff (`retry`, policy.py). Every other failure is raised at
once as a typed `RewardServerError`. Scores come back in the caller's order.

Where each part lives: base.py (options, chunking, tokenizer), policy.py (retries and
deadlines), grpc_client.py, http_client.py (one transport each), streaming.py
(`stream(...)` over each transport). This module keeps the names it always exported.
"""

from .base import DEFAULT_TIMEOUT_S, TRUNCATIONS, _AsyncClientBase
from .grpc_client import SERVICE_NAME, AsyncRewardClient, service_config
from .http_client import AsyncHttpRewardClient

__all__ = ["AsyncRewardClient", "AsyncHttpRewardClient", "service_config", "SERVICE_NAME", "TRUNCATIONS",
           "DEFAULT_TIMEOUT_S", "_AsyncClientBase"]
