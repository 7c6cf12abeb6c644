"""Wire codec: msgspec JSON body, CloudEvents 1.0 attributes in NATS headers (binary content mode).

Decoding never trusts the producer: size, envelope, type, version and body are all checked, and
every failure raises `DecodeError` with a short machine-readable `reason` and a human `detail`.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote, unquote

import msgspec

from events.base import Event, parse_event_type
from events.catalog import by_type, known_types
from events.upcast import can_upcast, upcast

SPECVERSION = "1.0"
CONTENT_TYPE = "application/json"
DEFAULT_MAX_BYTES = 256 * 1024  # a node sample of 8 GPUs with processes and NVLink is ~10 KiB

H_SPECVERSION = "ce-specversion"
H_ID = "ce-id"
H_SOURCE = "ce-source"
H_TYPE = "ce-type"
H_TIME = "ce-time"
H_CONTENT_TYPE = "content-type"
H_TRACEPARENT = "traceparent"
H_TRACESTATE = "tracestate"
H_MSG_ID = "Nats-Msg-Id"

_encoder = msgspec.json.Encoder()
_decoders: dict[type[Event], msgspec.json.Decoder[Event]] = {}
_by_type_decoders: dict[str, msgspec.json.Decoder[Event]] = {}  # ce-type -> decoder, for the types seen
# CloudEvents NATS (and HTTP) binding: in a `ce-` header value, space, '"', '%' and anything outside
# printable ASCII are percent-encoded (UTF-8). Everything else travels as is.
_CE_PLAIN = re.compile(r"^[\x21\x23\x24\x26-\x7e]*$")
_CE_SAFE = "!#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


def ce_value(value: str) -> str:
    """A `ce-` header value as the binding sends it (percent-encoded where it must be)."""
    return value if _CE_PLAIN.match(value) else quote(value, safe=_CE_SAFE)


def ce_unvalue(value: str) -> str:
    return unquote(value) if "%" in value else value


class DecodeError(ValueError):
    """A message that cannot become an event. `reason` is one of:

    oversized, envelope, content_type, unknown_type, unknown_version, malformed, invalid.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class UnknownEventType(DecodeError):
    """A well-formed event of a type this build does not know (newer producer): skip, don't crash."""

    def __init__(self, ce_type: str) -> None:
        super().__init__("unknown_type", f"event type {ce_type!r} is not known to this consumer")
        self.ce_type = ce_type


@dataclass(frozen=True)
class Envelope:
    event: Event
    id: str
    source: str
    type: str
    time: str
    traceparent: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def new_id() -> str:
    """A random event id, for the shell only (cores derive ids deterministically)."""
    return str(uuid.uuid4())


def stable_id(*parts: object) -> str:
    """A deterministic event id from the facts that make a decision unique (for replay dedup)."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()
    # `str(uuid.UUID(h[:32], version=5))`, formatted directly (a cycle makes one per decision): the
    # version nibble set to 5, the variant's top two bits to 10.
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def encode_body(event: Event) -> bytes:
    return _encoder.encode(event)


def encode(
    event: Event,
    *,
    source: str,
    id: str | None = None,
    time: float | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> tuple[dict[str, str], bytes]:
    """Headers and body for one event. The id doubles as `Nats-Msg-Id` for JetStream dedup."""
    event_id = ce_value(id or new_id())
    when = time if time is not None else datetime.now(tz=UTC).timestamp()
    headers = {
        H_SPECVERSION: SPECVERSION,
        H_ID: event_id,
        H_SOURCE: ce_value(source),
        H_TYPE: type(event).ce_type(),
        H_TIME: rfc3339(when),
        H_CONTENT_TYPE: CONTENT_TYPE,
        H_MSG_ID: event_id,  # the encoded id: what JetStream de-duplicates on is what consumers see
    }
    if traceparent:
        headers[H_TRACEPARENT] = traceparent
        if tracestate:
            headers[H_TRACESTATE] = tracestate
    return headers, encode_body(event)


def _decoder(cls: type[Event]) -> msgspec.json.Decoder[Event]:
    dec = _decoders.get(cls)
    if dec is None:
        dec = _decoders[cls] = msgspec.json.Decoder(cls)
    return dec


def _attributes(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    """The headers with names as the binding reads them (case-insensitive: `CE-ID` is `ce-id`).
    What this codec writes is already lower case: a message carrying the required attributes and
    content-type under those names is read as is (no copy per message: the hot path of every fold;
    optional attributes such as traceparent are then read under their lower-case names only)."""
    if not headers:
        return {}
    if (
        H_SPECVERSION in headers
        and H_ID in headers
        and H_SOURCE in headers
        and H_TYPE in headers
        and H_CONTENT_TYPE in headers
    ):
        return headers
    return {k.lower(): v for k, v in headers.items()}


def _checked(hdrs: Mapping[str, str], body: bytes, max_bytes: int) -> Event:
    """The checks every decode makes, in one place; the event, or DecodeError naming what was wrong."""
    if len(body) > max_bytes:
        raise DecodeError("oversized", f"body is {len(body)} bytes, the limit is {max_bytes}")
    spec = hdrs.get(H_SPECVERSION)
    if spec != SPECVERSION:
        raise DecodeError("envelope", f"header {H_SPECVERSION} is {spec!r}, expected {SPECVERSION!r}")
    if not (hdrs.get(H_ID) and hdrs.get(H_SOURCE) and hdrs.get(H_TYPE)):
        missing = next(name for name in (H_ID, H_SOURCE, H_TYPE) if not hdrs.get(name))
        raise DecodeError("envelope", f"header {missing} is missing")
    content_type = hdrs.get(H_CONTENT_TYPE, CONTENT_TYPE)
    if content_type != CONTENT_TYPE and content_type.split(";")[0].strip() != CONTENT_TYPE:
        raise DecodeError("content_type", f"content-type is {content_type!r}, expected {CONTENT_TYPE!r}")
    ce_type = hdrs[H_TYPE]
    decoder = _by_type_decoders.get(ce_type)
    if decoder is None:
        if by_type(ce_type) is None and can_upcast(ce_type):
            return _decode_upcast(ce_type, body)  # an older major: upcast, never cached as a decoder
        decoder = _type_decoder(ce_type)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise DecodeError("invalid", f"{ce_type}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise DecodeError("malformed", f"body is not valid JSON: {exc}") from None


def _type_decoder(ce_type: str) -> msgspec.json.Decoder[Event]:
    """The decoder of a known type (kept for the next message of that type), else why not."""
    cls = by_type(ce_type)
    if cls is None:
        parsed = parse_event_type(ce_type)
        if parsed is not None:
            domain, name, major = parsed
            known = sorted(t for t in known_types() if t.startswith(f"io.chamber.{domain}.{name}.v"))
            if known:
                raise DecodeError(
                    "unknown_version", f"event type {ce_type!r} has major version {major}; known: {known}"
                )
        raise UnknownEventType(ce_type)
    decoder = _by_type_decoders[ce_type] = _decoder(cls)
    return decoder


def decode(headers: Mapping[str, str] | None, body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Envelope:
    """Check and decode one message; raises DecodeError naming what was wrong."""
    # header names are case-insensitive in the binding (`CE-ID` is `ce-id`); values are percent-decoded
    hdrs = _attributes(headers)
    event = _checked(hdrs, body, max_bytes)
    return Envelope(
        event=event,
        id=ce_unvalue(hdrs[H_ID]),
        source=ce_unvalue(hdrs[H_SOURCE]),
        type=hdrs[H_TYPE],  # as on the wire; an upcast event's own type is `type(event).ce_type()`
        time=ce_unvalue(hdrs.get(H_TIME, "")),
        traceparent=hdrs.get(H_TRACEPARENT),
        headers=dict(headers or {}),
    )


def _decode_upcast(ce_type: str, body: bytes) -> Event:
    """An older major of a known type: its body upcast (events/upcast.py), then checked as the current type."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise DecodeError("malformed", f"body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise DecodeError("invalid", f"{ce_type}: the body is not a JSON object")
    current, raw = upcast(ce_type, raw)
    cls = by_type(current)
    if cls is None:
        raise UnknownEventType(ce_type)
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        raise DecodeError("invalid", f"{ce_type} (upcast to {current}): {exc}") from None


def decode_event(
    headers: Mapping[str, str] | None, body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Event, str]:
    """The event and its id, with exactly `decode`'s checks, without the envelope (a fold needs no
    more; it saves the envelope and the copy of the headers per message)."""
    hdrs = _attributes(headers)
    event = _checked(hdrs, body, max_bytes)
    return event, ce_unvalue(hdrs[H_ID])
