#!/usr/bin/env bash
# The README's main command: set-up (idempotent), then the whole local stack on the default
# model (`rmscore up --help` for its options; extra arguments are passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rmscore up "$@"
