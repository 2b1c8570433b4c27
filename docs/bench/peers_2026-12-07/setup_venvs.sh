#!/usr/bin/env bash
# The peers' venvs, as built on 2026-12-07 (PyPI only; no torch). Exact pins: peers-venv.freeze.txt,
# pytriton-venv.freeze.txt (pip install -r either reproduces them).
#   /tmp/peers/venv          Ray Serve 2.60.0 + BentoML 1.4.40, onnxruntime 1.32.0 (as requirements.lock), numpy 2.4.6
#   /tmp/peers/venv-pytriton nvidia-pytriton 0.7.0 (needs numpy<2, so a venv of its own), onnxruntime 1.32.0
set -euo pipefail
PY=${PYTHON:-python3.11}
mkdir -p /tmp/peers
$PY -m venv /tmp/peers/venv
/tmp/peers/venv/bin/pip install --upgrade pip
/tmp/peers/venv/bin/pip install "ray[serve]==2.60.0" "bentoml==1.4.40" onnxruntime==1.32.0 numpy==2.4.6 aiohttp
# bentoml pulls opentelemetry-sdk 1.45.1; ray's opentelemetry-exporter-prometheus 0.66b2 wants ~=1.45.2: 0.66b1 fits both.
/tmp/peers/venv/bin/pip install "opentelemetry-exporter-prometheus==0.66b1"
/tmp/peers/venv/bin/pip check
$PY -m venv /tmp/peers/venv-pytriton
/tmp/peers/venv-pytriton/bin/pip install --upgrade pip
/tmp/peers/venv-pytriton/bin/pip install "nvidia-pytriton==0.7.0" onnxruntime==1.32.0 "numpy<2"
/tmp/peers/venv-pytriton/bin/pip check
