#!/usr/bin/env bash
# Packs build/gpu-carry for a device run (docs/gpu.md; scripts/gpu_carry.py says what is in it).
# Needs this machine's .venv (onnx, safetensors, pip) and its package index, once.
# Pass --python-version X.Y when the device's Python differs from .venv's.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/gpu_carry.py pack "$@"
