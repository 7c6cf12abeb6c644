# One image, many commands: every workload runs a `chamber` sub-command.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY events events
COPY node_agent node_agent
COPY services services
RUN python -m venv /opt/chamber && /opt/chamber/bin/pip install --no-cache-dir .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/chamber chamber
COPY --from=build /opt/chamber /opt/chamber
ENV PATH=/opt/chamber/bin:$PATH PYTHONDONTWRITEBYTECODE=1 CHAMBER_DATA_DIR=/var/lib/chamber
USER 10001
ENTRYPOINT ["chamber"]
CMD ["--help"]
