# One image for every role: `docker run IMAGE run --role gateway|config|sidecar|worker|all`.
# Build the GPU variant with `--build-arg ORT_EXTRA=gpu-cuda` (onnxruntime-gpu + CUDA wheels).
# A role refuses SIE_* variables it does not read, so the image sets none: the baseline catalogue ships
# inside the package (src/sie/config), and the model cache defaults to $XDG_CACHE_HOME/sie/models.
FROM python:3.11-slim

ARG ORT_EXTRA=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    XDG_CACHE_HOME=/var/cache

WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[${ORT_EXTRA}]" && useradd --system --home /app sie && mkdir -p /var/cache/sie \
    && chown -R sie /var/cache/sie
USER sie

EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)" || exit 1
ENTRYPOINT ["sie"]
# `all` listens on 127.0.0.1 unless told otherwise; in the container it must be reachable through the port.
CMD ["run", "--role", "all", "--host", "0.0.0.0"]
