#!/usr/bin/env bash
# collect_runtime_libs.sh OUT_DIR BINARY...
# Copies every shared library the binaries load (as ldd resolves them: gRPC,
# protobuf, abseil, prometheus-cpp, OpenSSL, ...) into OUT_DIR, so the C++
# runtime image carries exactly what the build linked, whatever its base
# (debian:bookworm-slim, or a CUDA base for the GPU variant). The C and C++
# runtimes (glibc, libstdc++, libgcc_s) are left to the base image, which
# always has them at the same or a newer version. ONNX Runtime is skipped
# here: the image ships third_party/onnxruntime/lib as is, at the path in the
# binary's RUNPATH (the exact pinned library, and its CUDA provider if any).
set -euo pipefail
out="$1"; shift
mkdir -p "$out"
for bin in "$@"; do
  if ldd "$bin" | grep -q "not found"; then
    echo "collect_runtime_libs: $bin has unresolved libraries:" >&2
    ldd "$bin" >&2
    exit 1
  fi
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|ld-linux*) continue ;;
      libstdc++.so.*|libgcc_s.so.*) continue ;;
      libonnxruntime*) continue ;;
    esac
    cp -L "$lib" "$out/$(basename "$lib")"
  done
done
echo "collect_runtime_libs: $(find "$out" -maxdepth 1 -type f | wc -l) libraries in $out"
