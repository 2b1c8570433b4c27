#!/usr/bin/env bash
# The README's main command: set-up (idempotent), then `rmscore up` on the default model: each
# server kind alone (the ranking), then all at once, then runs/up-<time>/index.html
# (`rmscore up --help` for its options; extra arguments are passed on, e.g. --keep-running).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rmscore up "$@"
