"""Thin transports over the core: gRPC (`grpc_server`), FastAPI (`http_server`, with the OpenRLHF
route in `openrlhf`), and `rmscore serve` (`cli`)."""
