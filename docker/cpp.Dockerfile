# rmscore C++ gRPC server (build/cpp/rmscore-server-cpp).
#
# Build stage: scripts/setup.sh, the same script as a local set-up, runs its
# `apt` and `cpp` steps (Debian packages, the ONNX Runtime SDK pinned by
# scripts/setup_ort_sdk.sh, CMake + Ninja via scripts/build_cpp.sh), then the
# gRPC health probe is built against the same gRPC. Runtime stage: a slim base
# with the binary, the pinned libonnxruntime at the path in the binary's
# RUNPATH, and the shared libraries the build linked (collect_runtime_libs.sh).
#
# The binaries are stripped (the symbols stay in the build stage's build/cpp),
# and only the server, its unit tests and the probe are built: not the fuzz
# target (setup.sh's `cpp` step builds that too, so the two scripts it runs are
# run here directly).
#
#   docker build -f docker/cpp.Dockerfile -t rmscore-cpp .
#   GPU (compose profile `gpu`): --build-arg RMSCORE_GPU=1
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
#   (the library then comes from onnxruntime-gpu, with its CUDA provider; CUDA
#   and cuDNN from the base image; start the server with --device cuda).
# One BASE_IMAGE for both stages: the gRPC, protobuf and abseil the build
# links are copied into the runtime, so they must come from the same
# distribution release as the runtime's libstdc++ and glibc.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
# Every stage this project builds carries the label, intermediate stages included: scripts/build_images.sh
# removes, by it, what its earlier builds left untagged (GBs a build).
LABEL io.rmscore.build=rmscore
ARG RMSCORE_GPU=0
ARG RMSCORE_BUILD_JOBS=4
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/rmscore
# Only what the C++ build reads (server_cpp/CMakeLists.txt: RMSCORE_ROOT/...).
COPY scripts/ scripts/
# Debian's packages in a layer of their own: a change to the sources below does not fetch them again.
RUN RMSCORE_APT_DEV=0 RMSCORE_STEPS=apt scripts/setup.sh
COPY proto/ proto/
COPY server_cpp/ server_cpp/
COPY server_py/rmscore/core/metrics.json server_py/rmscore/core/metrics.json
COPY contract/batching_vectors.json contract/batching_vectors.json
COPY docker/healthcheck/ docker/healthcheck/
COPY docker/collect_runtime_libs.sh docker/collect_runtime_libs.sh
COPY docker/requirements-cpp-cpu.lock docker/requirements-cpp-gpu.lock docker/
# scripts/build_images.sh's pre-downloaded wheel, where it ran (hash-checked below all the same).
COPY docker/wheelhouse/cpp/ /tmp/wheelhouse/
# setup_ort_sdk.sh downloads the pinned wheel with .venv/bin/pip when there is
# one, else `python3 -m pip`, which Debian's python3 lacks: a bare venv gives it
# pip without installing the Python requirements this image does not need.
# The wheel is downloaded here first, checked against its sha256 in
# docker/requirements-cpp-{cpu,gpu}.lock (--require-hashes); setup_ort_sdk.sh
# then runs with no index and can take only that file.
RUN python3 -m venv .venv \
 && flavour=cpu; if [ "${RMSCORE_GPU}" = 1 ]; then flavour=gpu; fi \
 && wheels="$(mktemp -d)" \
 && if [ "${flavour}" = cpu ] && ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheelhouse; fi \
 && .venv/bin/pip download --require-hashes --no-deps --only-binary :all: -d "${wheels}" -r "docker/requirements-cpp-${flavour}.lock" \
 && PIP_NO_INDEX=1 PIP_FIND_LINKS="${wheels}" RMSCORE_ORT_GPU="${RMSCORE_GPU}" scripts/setup_ort_sdk.sh \
 && rm -rf "${wheels}" /tmp/wheelhouse \
 && RMSCORE_BUILD_JOBS="${RMSCORE_BUILD_JOBS}" scripts/build_cpp.sh \
 && docker/healthcheck/build.sh build/healthcheck \
 && docker/collect_runtime_libs.sh /opt/rmscore/lib build/cpp/rmscore-server-cpp build/healthcheck/grpc_health_probe \
 && build/cpp/rmscore-tests --gtest_brief=1 \
 && mkdir -p /opt/rmscore/bin \
 && strip --strip-unneeded -o /opt/rmscore/bin/rmscore-server-cpp build/cpp/rmscore-server-cpp \
 && strip --strip-unneeded -o /opt/rmscore/bin/grpc_health_probe build/healthcheck/grpc_health_probe

FROM ${BASE_IMAGE} AS runtime
LABEL io.rmscore.build=rmscore
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin rmscore \
 && mkdir -p /opt/rmscore/models /var/cache/rmscore \
 && chown rmscore:rmscore /opt/rmscore/models /var/cache/rmscore
WORKDIR /opt/rmscore
COPY --from=build /opt/rmscore/third_party/onnxruntime/lib/ /opt/rmscore/third_party/onnxruntime/lib/
COPY --from=build /opt/rmscore/lib/ /opt/rmscore/lib/
COPY --from=build /opt/rmscore/bin/ /opt/rmscore/bin/
ENV LD_LIBRARY_PATH=/opt/rmscore/lib PATH=/opt/rmscore/bin:${PATH}
USER 10001:10001
# models/default comes from the model-export job (docker-compose.yml) through a volume.
EXPOSE 50051 9100
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["grpc_health_probe", "127.0.0.1:50051", "--service", "", "--service", "liveness"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["rmscore-server-cpp"]
CMD ["--model", "/opt/rmscore/models/default", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9100"]
