"""Thin transports over the core: gRPC (`grpc_server`), FastAPI (`http_app`, its middlewares in
`http_middleware`, run by `http_server`; the OpenRLHF route in `openrlhf`), and `rmscore serve` (`cli`)."""
