#!/usr/bin/env bash
# Builds grpc_health_probe into OUT_DIR (default build/healthcheck) with Debian's
# protoc, grpc_cpp_plugin and libgrpc++ (the packages scripts/setup.sh installs
# for the C++ server). Used by docker/cpp.Dockerfile and by tests/deploy/test_deploy.py.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$(mkdir -p "${1:-build/healthcheck}" && cd "${1:-build/healthcheck}" && pwd)"
GEN="$OUT/gen"
mkdir -p "$GEN"
protoc -I "$HERE" --cpp_out="$GEN" --grpc_out="$GEN" \
  --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" "$HERE/health.proto"
# shellcheck disable=SC2046  # pkg-config prints several flags
g++ -std=c++17 -O2 -Wall -Wextra -I "$GEN" \
  "$HERE/grpc_health_probe.cc" "$GEN/health.pb.cc" "$GEN/health.grpc.pb.cc" \
  -o "$OUT/grpc_health_probe" $(pkg-config --cflags --libs grpc++ protobuf)
echo "[healthcheck] built $OUT/grpc_health_probe"
