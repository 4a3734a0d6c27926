# syntax=docker/dockerfile:1.7
# The guard as a container: `schedguard serve`, a sidecar in front of an LLM server.
#
#   docker build -t schedguard:0.1.0 .
#   docker run --rm -p 8080:8080 schedguard:0.1.0 --upstream http://vllm:8000
#   docker run --rm -p 8080:8080 -v $PWD/policy.yaml:/etc/schedguard/policy.yaml:ro \
#       -e SCHEDGUARD_POLICY=/etc/schedguard/policy.yaml schedguard:0.1.0
#
# Without --upstream (or upstream.url in the policy) the reference scheduler is started inside
# as an embedded upstream, so the image also works on its own. The install steps are
# scripts/install.sh, the script tests/test_dockerfile.py runs; that test also lints this file.
# Pin the base by digest in production (docker buildx imagetools inspect python:3.11.11-slim-bookworm).

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: the wheel, installed with its runtime dependencies into /opt/schedguard ---------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
# Every package of the wheel: each `schedguard` command runs in the image, or says in one line
# which extra it needs (`schedguard load`: the `load` extra, not installed here).
COPY guard ./guard
COPY scheduler_ref ./scheduler_ref
COPY schedguard ./schedguard
COPY payloads ./payloads
COPY fuzz ./fuzz
COPY loadtests ./loadtests
COPY scripts/install.sh ./scripts/install.sh
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
    && sh scripts/install.sh /opt/schedguard /dist/schedguard-*.whl --extras redis,extproc --no-pip

# ---- runtime: the environment only, owned by root, run as an unprivileged user --------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="schedguard" \
      org.opencontainers.image.description="A gateway that stops resource-exhaustion requests before the LLM server" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 schedguard \
    && useradd --system --uid 10001 --gid schedguard --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin schedguard \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/schedguard
COPY --from=build --chown=root:root /opt/schedguard /opt/schedguard
ENV PATH=/opt/schedguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# The one writable directory: where `schedguard fuzz run` (say) writes its outputs by default.
WORKDIR /var/lib/schedguard
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["schedguard", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD []
