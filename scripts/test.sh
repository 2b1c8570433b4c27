#!/usr/bin/env bash
# The README's test command: set-up (idempotent), then every test suite.
#   C++ unit tests (ctest), the Python suites (pytest: planner, batcher, export parity,
#   the conformance suite over every server kind, client, load test, deployment checks,
#   bounded fuzzing of request decoding + validation: tests/test_fuzz.py, RMSCORE_FUZZ_SECONDS),
#   and the C++ unit tests + conformance suite again under AddressSanitizer/UBSan.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k conformance`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
say() { printf '\033[1m[test]\033[0m %s\n' "$*"; }
status=0

say "C++ unit tests (ctest)"
ctest --test-dir build/cpp --output-on-failure || status=1

say "Python tests (pytest)"
.venv/bin/python -m pytest "$@" || status=1

if [ "${RMSCORE_SANITIZE:-1}" = 1 ]; then
  say "C++ under AddressSanitizer + UndefinedBehaviorSanitizer: unit tests and the conformance suite"
  bash scripts/build_cpp.sh --sanitize
  ctest --test-dir build/cpp-asan --output-on-failure || status=1
  RMSCORE_CPP_BINARY=build/cpp-asan/rmscore-server-cpp RMSCORE_TEST_KINDS=cpp-grpc \
    .venv/bin/python -m pytest -q tests/test_conformance.py || status=1
fi
exit $status
