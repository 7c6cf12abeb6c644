"""OpenTelemetry: one span per handled message, continuing the producer's `traceparent`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()
tracer = trace.get_tracer("chamber")


def current_traceparent() -> tuple[str | None, str | None]:
    """The traceparent (and tracestate) of the active span, to put in outgoing headers."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate")


@contextmanager
def consume_span(
    headers: Mapping[str, str] | None, *, stream: str, subject: str, message_id: str | None
) -> Iterator[Span]:
    parent = _propagator.extract(carrier=dict(headers or {}))
    token = otel_context.attach(parent)
    try:
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
