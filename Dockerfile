# syntax=docker/dockerfile:1
# One image, many commands: every workload runs a `chamber` sub-command
# (`chamber service scheduler`, `chamber agent`, `chamber nats-config`, ...).

# --- build: resolve and install into a self-contained virtualenv ----------------------------------
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/chamber
# dependencies first (cached while only the code changes): every one ships a manylinux wheel
COPY pyproject.toml README.md ./
RUN mkdir -p events node_agent services \
 && touch events/__init__.py node_agent/__init__.py services/__init__.py \
 && /opt/chamber/bin/pip install . \
 && /opt/chamber/bin/pip uninstall -y chamber
COPY events events
COPY node_agent node_agent
COPY services services
# the final image installs nothing: no pip, setuptools or wheel go into it
RUN /opt/chamber/bin/pip install --no-deps . \
 && /opt/chamber/bin/python -m compileall -q /opt/chamber/lib \
 && /opt/chamber/bin/pip uninstall -y pip setuptools wheel \
 && rm -f /opt/chamber/bin/pip* /opt/chamber/bin/wheel

# --- runtime: slim base, the virtualenv, a non-root user; no compilers, no package manager use -------
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="chamber" \
      org.opencontainers.image.description="Chamber: a shared GPU fleet run near its limit" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN python -m pip uninstall -y pip setuptools wheel \
 && rm -rf /usr/local/bin/pip* /root/.cache \
 && groupadd --system --gid 10001 chamber \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/chamber --no-create-home --shell /usr/sbin/nologin chamber \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/chamber
COPY --from=build /opt/chamber /opt/chamber
# the warehouse's DDL migrations (schemas/clickhouse) are read at start, outside the Python package
COPY schemas /opt/chamber/share/chamber/schemas
ENV PATH=/opt/chamber/bin:$PATH \
    CHAMBER_CLICKHOUSE_SCHEMAS=/opt/chamber/share/chamber/schemas/clickhouse \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CHAMBER_DATA_DIR=/var/lib/chamber \
    HOME=/var/lib/chamber
WORKDIR /var/lib/chamber
USER 10001:10001
# probes (runtime health server, CHAMBER_HEALTH_PORT) and the gateway
EXPOSE 8081 8080
ENTRYPOINT ["chamber"]
CMD ["--help"]
