"""OpenTelemetry: one span per handled message or command, continuing the producer's `traceparent`.

`configure_tracing` installs a real tracer provider in every process (the service host, the node
agent, the gateway, the CLI): without one, OpenTelemetry's default spans carry no trace context, and
no event would carry a `traceparent`. Spans are exported over OTLP only when
OTEL_EXPORTER_OTLP_ENDPOINT is set (the standard variable; OTEL_SERVICE_NAME and the other OTEL_*
variables apply as usual); otherwise they only propagate.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()
tracer = trace.get_tracer("chamber")
_configured = False
_exporting = False  # spans leave the process (OTLP); else only the trace context matters


def configure_tracing(service: str) -> None:
    """Install the SDK tracer provider once per process (later calls do nothing)."""
    global _configured, _exporting
    if _configured:
        return
    _configured = True
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    name = os.environ.get("OTEL_SERVICE_NAME") or f"chamber-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _exporting = True
    trace.set_tracer_provider(provider)


def tracing_configured() -> bool:
    return _configured


def current_traceparent() -> tuple[str | None, str | None]:
    """The traceparent (and tracestate) of the active span, to put in outgoing headers."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate")


def traced(headers: Mapping[str, str] | None) -> bool:
    """Whether consuming a message with these headers needs `consume_span`: spans are exported, or
    the message carries a trace context to continue."""
    return _exporting or _carries_trace(headers)


def _carries_trace(headers: Mapping[str, str] | None) -> bool:
    """A W3C trace context among the headers (names are case-insensitive)."""
    if not headers:
        return False
    return "traceparent" in headers or any(name.lower() == "traceparent" for name in headers)


def _lower(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers or {}).items()}


@contextmanager
def produce_span(subject: str) -> Iterator[None]:
    """A producer span around one publish when no span is active, so the event starts a trace."""
    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    with tracer.start_as_current_span(
        f"send {subject}", kind=SpanKind.PRODUCER, attributes={"messaging.system": "nats"}
    ):
        yield


def root_traceparent() -> str:
    """A new trace's context without a span object: for the agent's samples, about 1 µs instead of
    about 30 (a span per sample, 1,000 nodes a second, would cost more than the sample's encoding).
    Random ids as OpenTelemetry's own RandomIdGenerator makes them; sampled flag set."""
    return f"00-{random.getrandbits(128) or 1:032x}-{random.getrandbits(64) or 1:016x}-01"


def publish_traceparent() -> tuple[str | None, str | None]:
    """The trace context for one outgoing event: the active span's, or a new producer span's."""
    with produce_span("chamber"):
        return current_traceparent()


@contextmanager
def client_span(service: str, verb: str) -> Iterator[None]:
    """The requester's side of a command (a child of the active span, if any)."""
    with tracer.start_as_current_span(
        f"{service}.{verb}", kind=SpanKind.CLIENT, attributes={"rpc.service": service, "rpc.method": verb}
    ):
        yield


@contextmanager
def command_span(headers: Mapping[str, str] | None, *, service: str, verb: str) -> Iterator[Span]:
    """The server side of a command: continues the requester's trace, so the events it publishes do."""
    token = otel_context.attach(_propagator.extract(carrier=_lower(headers)))
    try:
        with tracer.start_as_current_span(
            f"{service}.{verb}",
            kind=SpanKind.SERVER,
            attributes={"messaging.system": "nats", "rpc.service": service, "rpc.method": verb},
        ) as span:
            yield span
    finally:
        otel_context.detach(token)


@contextmanager
def consume_span(
    headers: Mapping[str, str] | None, *, stream: str, subject: str, message_id: str | None
) -> Iterator[Span]:
    if not traced(headers):
        # Nothing to continue and nothing would see a span of ours: skip the propagator's extract
        # and the context switch, a few microseconds per message on every consumer.
        yield trace.get_current_span()
        return
    parent = _propagator.extract(carrier=_lower(headers))
    token = otel_context.attach(parent)
    try:
        if not _exporting:
            # Nothing would see a span of ours: continue the producer's trace as it is (what this
            # handler publishes carries its trace id), without the cost of a span per message.
            yield trace.get_current_span()
            return
        with tracer.start_as_current_span(
            f"process {stream}",
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "messaging.message.id": message_id or "",
            },
        ) as span:
            yield span
    finally:
        otel_context.detach(token)
