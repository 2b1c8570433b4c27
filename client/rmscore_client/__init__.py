"""rmscore_client: the trainer's side of rmscore.

- `RewardClient` / `AsyncRewardClient`: gRPC (any server kind), replicas via gRPC round_robin.
- `HttpRewardClient` / `AsyncHttpRewardClient`: the same interface over the FastAPI server.
- `rmscore_client.adapters.trl`: reward functions for TRL's GRPOTrainer.

See docs/client.md.
"""

from .grpc_client import AsyncRewardClient, service_config
from .http_client import AsyncHttpRewardClient
from .errors import (Cancelled, DeadlineExceeded, InternalError, InvalidInput, MessageTooLarge, Overloaded,
                     RewardServerError, Unauthenticated, Unavailable)
from .sync import HttpRewardClient, RewardClient
from .types import NO_RETRY, ChunkTiming, Health, ModelInfo, RetryPolicy, ScoreResult

__all__ = [
    "RewardClient", "AsyncRewardClient", "HttpRewardClient", "AsyncHttpRewardClient", "service_config",
    "RewardServerError", "InvalidInput", "Overloaded", "MessageTooLarge", "Unavailable", "DeadlineExceeded",
    "Cancelled", "InternalError", "Unauthenticated", "RetryPolicy", "NO_RETRY", "ScoreResult", "ChunkTiming", "ModelInfo", "Health",
]
