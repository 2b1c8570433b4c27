#!/usr/bin/env bash
# Configures and builds the C++ server (server_cpp/) with CMake + Ninja.
#   scripts/build_cpp.sh             -> build/cpp/rmscore-server-cpp, build/cpp/rmscore-tests
#   scripts/build_cpp.sh --sanitize  -> build/cpp-asan/ (-fsanitize=address,undefined)
#   scripts/build_cpp.sh --fuzz      -> build/cpp-fuzz/fuzz_cpp_validation (clang++, libFuzzer; docs/fuzzing.md)
#   scripts/build_cpp.sh --test      -> also runs ctest
# Idempotent: reconfigures only when needed; Ninja rebuilds only what changed.
# Needs the Debian packages (see docs/cpp_server.md) and the ORT SDK
# (scripts/setup_ort_sdk.sh, run here when missing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build/cpp"
SANITIZE=OFF
FUZZ=OFF
RUN_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) SANITIZE=ON; BUILD="$ROOT/build/cpp-asan" ;;
    --fuzz) FUZZ=ON; BUILD="$ROOT/build/cpp-fuzz" ;;
    --test) RUN_TESTS=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "build_cpp.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
# 2 cores and 24 GiB here: more parallel g++ jobs only swap.
JOBS="${RMSCORE_BUILD_JOBS:-2}"

say() { echo "[build_cpp] $*"; }

if [[ "$FUZZ" == "ON" ]]; then
  # Only messages + validation: no ORT SDK needed, and clang++ for libFuzzer.
  if [[ ! -f "$BUILD/build.ninja" ]] || ! grep -q "RMSCORE_FUZZ:BOOL=ON" "$BUILD/CMakeCache.txt" 2>/dev/null; then
    say "configuring $BUILD (fuzz, clang++)"
    cmake -S "$ROOT/server_cpp" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRMSCORE_FUZZ=ON
  fi
  say "building $BUILD with $JOBS jobs"
  cmake --build "$BUILD" --parallel "$JOBS"
  say "built $BUILD/fuzz_cpp_validation"
  exit 0
fi

if [[ ! -f "$ROOT/third_party/onnxruntime/lib/libonnxruntime.so" ]]; then
  say "ONNX Runtime SDK missing: running scripts/setup_ort_sdk.sh"
  "$ROOT/scripts/setup_ort_sdk.sh"
fi

if [[ ! -f "$BUILD/build.ninja" ]] || ! grep -q "RMSCORE_SANITIZE:BOOL=$SANITIZE" "$BUILD/CMakeCache.txt" 2>/dev/null; then
  say "configuring $BUILD (sanitize=$SANITIZE)"
  cmake -S "$ROOT/server_cpp" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRMSCORE_SANITIZE="$SANITIZE"
fi
say "building $BUILD with $JOBS jobs"
cmake --build "$BUILD" --parallel "$JOBS"
say "built $BUILD/rmscore-server-cpp and $BUILD/rmscore-tests"

if [[ "$RUN_TESTS" == "1" ]]; then
  say "running ctest"
  (cd "$BUILD" && ctest --output-on-failure)
fi
