"""rmscore: the Python scoring servers.

core/       transport-free: config, errors, planner, batcher, validation, metrics, the scoring core
runtimes/   model runtimes behind one interface: ONNX Runtime, PyTorch eager and torch.compile
frontends/  thin transports over the core: gRPC, FastAPI (with the OpenRLHF route), `rmscore serve`
model/      the model repository: export, its reader, the embedded default model
tools/      the one registry of server kinds and the one launcher

Imports point down the layers cli/tools, frontends, runtimes, core, model; the front ends' runners
hand ScoringCore its runtime (docs/architecture.md, "Layers"; tests/unit/test_layers.py).
"""
