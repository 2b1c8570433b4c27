"""Transport-free serving core: one config, one error type, the planner, the batcher, validation,
metrics and `ScoringCore`, which the gRPC and HTTP front ends share."""
