# Prometheus for the compose stack, from Debian's own package (2.42 on bookworm), so the stack needs
# no registry: docker-compose.yml mounts docker/prometheus/{prometheus,rules,alerts}.yml into
# /etc/prometheus/. wget: the compose health check asks /-/ready with it, as on the upstream image.
#
#   docker build -f docker/prometheus.Dockerfile -t rmscore-prometheus .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# Every stage this project builds carries the label, intermediate stages included: scripts/build_images.sh
# removes, by it, what its earlier builds left untagged (GBs a build).
LABEL io.rmscore.build=rmscore
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Versions come with the base image's release (as in the other images).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin rmscore \
 && mkdir -p /prometheus && chown rmscore:rmscore /prometheus
# The same numeric user as the other images (the package's own `prometheus` user has no fixed uid).
USER 10001:10001
EXPOSE 9090
VOLUME ["/prometheus"]
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
