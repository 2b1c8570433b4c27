#!/usr/bin/env bash
# The README's test command: set-up (idempotent), then the tests.
#
#   bash scripts/test.sh [TIER] [pytest arguments]
#
# TIER (tests/conftest.py says what each holds):
#   unit          Python unit tests, no server and no model needed; the C++ unit
#                 tests too when the C++ build is there
#   conformance   the contract on every server kind
#   integration   client, adapters, benchmark, load test, faults, export parity, bounded fuzzing
#   deploy        compose, images, manifests, dashboards and rules with real tools
#   all           (the default, and CI) every tier, C++ unit tests (ctest), then the C++ unit tests
#                 and the conformance tier again under AddressSanitizer/UBSan
# Extra arguments go to pytest (e.g. `bash scripts/test.sh conformance -k deadline`).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[test]\033[0m %s\n' "$*"; }
tier=all
case "${1:-}" in unit|conformance|integration|deploy|all) tier=$1; shift ;; esac

if [ "$tier" = unit ]; then
  RMSCORE_STEPS=${RMSCORE_STEPS:-apt,venv,stubs} bash scripts/setup.sh
  status=0
  if [ -f build/cpp/CTestTestfile.cmake ]; then
    say "C++ unit tests (ctest)"; ctest --test-dir build/cpp --output-on-failure || status=1
  else
    say "C++ unit tests: skipped, build/cpp is not built (bash scripts/setup.sh builds it)"
  fi
  say "Python unit tests"
  .venv/bin/python -m pytest tests/unit "$@" || status=1
  exit $status
fi

bash scripts/setup.sh
if [ "$tier" = all ] || [ "$tier" = deploy ]; then
  # The compose stack's test needs an engine; without one it skips and says why.
  RMSCORE_STEPS=containers bash scripts/setup.sh || say "no container engine: the compose stack's test will skip"
fi
if [ "$tier" != all ]; then
  say "Python tests: tests/$tier"
  exec .venv/bin/python -m pytest "tests/$tier" "$@"
fi

status=0
say "C++ unit tests (ctest)"
ctest --test-dir build/cpp --output-on-failure || status=1

say "Python tests (pytest, every tier)"
.venv/bin/python -m pytest "$@" || status=1

if [ "${RMSCORE_SANITIZE:-1}" = 1 ]; then
  say "C++ under AddressSanitizer + UndefinedBehaviorSanitizer: unit tests and the conformance suite"
  bash scripts/build_cpp.sh --sanitize
  ctest --test-dir build/cpp-asan --output-on-failure || status=1
  RMSCORE_CPP_BINARY=build/cpp-asan/rmscore-server-cpp RMSCORE_TEST_KINDS=cpp-grpc \
    .venv/bin/python -m pytest -q tests/conformance/test_conformance.py tests/conformance/test_stream_deadline.py || status=1
fi
exit $status
