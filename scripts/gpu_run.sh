#!/usr/bin/env bash
# On a lent GPU machine with no network (docs/gpu.md): unpack the carry that
# scripts/gpu_carry.sh made into build/gpu-run, then run the GPU check
# (tools/rmscore_tools/bench/gpu_check.py) on
# the machine's own Python (its torch, numpy and onnxruntime) with the carried
# packages ahead on PYTHONPATH. Arguments go to gpu_check.py, e.g.
#   bash scripts/gpu_run.sh --out "$OUT/gpu_report.md"
#   bash scripts/gpu_run.sh --device cpu --quick      # the dry run, on any machine
# RMSCORE_PYTHON picks the interpreter (default python3); RMSCORE_GPU_CARRY the carry.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${RMSCORE_PYTHON:-python3}
CARRY=${RMSCORE_GPU_CARRY:-build/gpu-carry}
RUN_DIR=build/gpu-run
# Nothing may reach for the network: the Hugging Face libraries would try the Hub on a cache miss.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
"$PY" scripts/gpu_carry.py unpack --carry "$CARRY" --into "$RUN_DIR"
export PYTHONPATH="$ROOT/$RUN_DIR/site:$ROOT/server_py:$ROOT/client${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" tools/rmscore_tools/bench/gpu_check.py --model "$RUN_DIR/model" "$@"
