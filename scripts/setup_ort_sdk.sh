#!/usr/bin/env bash
# Assembles the ONNX Runtime C/C++ SDK the C++ server builds against, into
# third_party/onnxruntime/{include,lib} (gitignored).
#
# Why two sources: Debian 12 packages no ONNX Runtime, and no PyPI package
# ships its headers. So the headers come from Debian 13's libonnxruntime-dev
# (downloaded and unpacked only, through a private apt configuration that
# leaves the system's sources alone), and the library from the pinned PyPI
# wheel that the Python servers use too. ORT versions its symbols per release
# (OrtGetApiBase@VERS_1.32.0): the binary runs only with the exact library it
# was linked against, so the version is pinned and that file is shipped.
#
# RMSCORE_ORT_GPU=1 takes the library from onnxruntime-gpu (CUDA EP) instead,
# into the same place; the provider libraries it needs are copied beside it.
# Idempotent: does nothing when the SDK of the wanted flavour is present
# (RMSCORE_ORT_FORCE=1 rebuilds it).
set -euo pipefail

ORT_VERSION="${RMSCORE_ORT_VERSION:-1.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SDK="$ROOT/third_party/onnxruntime"
FLAVOUR=cpu
WHEEL_PKG=onnxruntime
if [[ "${RMSCORE_ORT_GPU:-0}" == "1" ]]; then
  FLAVOUR=gpu
  WHEEL_PKG=onnxruntime-gpu
  # onnxruntime-gpu trails onnxruntime on PyPI; setup.sh and the GPU locks take the same version.
  ORT_VERSION="${RMSCORE_ORT_GPU_VERSION:-1.31.1}"
fi
STAMP="$SDK/.sdk-$WHEEL_PKG-$ORT_VERSION"

say() { echo "[setup_ort_sdk] $*"; }

if [[ -f "$STAMP" && "${RMSCORE_ORT_FORCE:-0}" != "1" ]]; then
  say "present: $SDK ($WHEEL_PKG $ORT_VERSION); nothing to do"
  exit 0
fi

WORK="$ROOT/.cache/ort-sdk"
mkdir -p "$WORK"

# --- headers -----------------------------------------------------------------
fetch_headers() {
  local D="$WORK/apt"
  if ls "$D"/libonnxruntime-dev_*_amd64.deb >/dev/null 2>&1; then
    say "headers: reusing $(ls "$D"/libonnxruntime-dev_*_amd64.deb)"
  else
    local codename=""
    codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    mkdir -p "$D"
    if [[ "$codename" == "trixie" ]] && (cd "$D" && apt-get download libonnxruntime-dev); then
      say "headers: downloaded libonnxruntime-dev with the system's apt sources (Debian 13)"
    else
      say "headers: downloading Debian 13 libonnxruntime-dev through a private apt config in $D (system sources untouched)"
      mkdir -p "$D/etc" "$D/lists/partial" "$D/cache/archives/partial"
      echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' \
        > "$D/etc/sources.list"
      local A=(-o "Dir::Etc::sourcelist=$D/etc/sources.list" -o "Dir::Etc::sourceparts=-"
               -o "Dir::State::Lists=$D/lists" -o "Dir::Cache=$D/cache")
      apt-get "${A[@]}" update
      (cd "$D" && apt-get "${A[@]}" -o APT::Sandbox::User=root download libonnxruntime-dev)
    fi
  fi
  local deb
  deb="$(ls "$D"/libonnxruntime-dev_*_amd64.deb | head -n1)"
  rm -rf "$WORK/ortdev"
  dpkg -x "$deb" "$WORK/ortdev"
  rm -rf "$SDK/include"
  mkdir -p "$SDK/include"
  cp -r "$WORK/ortdev/usr/include/onnxruntime/." "$SDK/include/"
  say "headers: $(grep -m1 -o 'ORT_API_VERSION [0-9]*' "$SDK/include/onnxruntime_c_api.h") -> $SDK/include"
}

# --- library -------------------------------------------------------------------
fetch_library() {
  local PIP
  if [[ -x "$ROOT/.venv/bin/pip" ]]; then PIP=("$ROOT/.venv/bin/pip"); else PIP=(python3 -m pip); fi
  local W="$WORK/wheel-$WHEEL_PKG-$ORT_VERSION"
  mkdir -p "$W"
  if ! ls "$W"/*.whl >/dev/null 2>&1; then
    say "library: ${PIP[*]} download --no-deps --only-binary :all: $WHEEL_PKG==$ORT_VERSION"
    "${PIP[@]}" download --no-deps --only-binary :all: -d "$W" "$WHEEL_PKG==$ORT_VERSION"
  else
    say "library: reusing $(ls "$W"/*.whl)"
  fi
  local whl
  whl="$(ls "$W"/*.whl | head -n1)"
  rm -rf "$W/x"
  mkdir -p "$W/x"
  # A wheel is a zip; python3 is always there, unzip may not be.
  python3 - "$whl" "$W/x" <<'EOF'
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist()
             if n.startswith("onnxruntime/capi/") and ".so" in n and "pybind" not in n]
    for n in names:
        z.extract(n, out)
print("\n".join(names))
EOF
  local capi="$W/x/onnxruntime/capi"
  [[ -f "$capi/libonnxruntime.so.$ORT_VERSION" ]] || { say "ERROR: no libonnxruntime.so.$ORT_VERSION in $whl"; exit 1; }
  rm -rf "$SDK/lib"
  mkdir -p "$SDK/lib"
  cp "$capi/libonnxruntime.so.$ORT_VERSION" "$SDK/lib/"
  if [[ "$FLAVOUR" == "gpu" ]]; then
    # The CUDA EP is a separate provider library loaded at run time from the
    # directory of libonnxruntime; CUDA/cuDNN themselves must be installed.
    cp "$capi"/libonnxruntime_providers_*.so "$SDK/lib/" 2>/dev/null || true
  fi
  ln -sf "libonnxruntime.so.$ORT_VERSION" "$SDK/lib/libonnxruntime.so.1"
  ln -sf "libonnxruntime.so.1" "$SDK/lib/libonnxruntime.so"
  say "library: $(ls "$SDK/lib" | tr '\n' ' ')-> $SDK/lib"
}

mkdir -p "$SDK"
rm -f "$SDK"/.sdk-*
[[ -f "$SDK/include/onnxruntime_cxx_api.h" && "${RMSCORE_ORT_FORCE:-0}" != "1" ]] \
  && say "headers: present in $SDK/include" || fetch_headers
fetch_library
touch "$STAMP"
say "done: $SDK ($WHEEL_PKG $ORT_VERSION)"
