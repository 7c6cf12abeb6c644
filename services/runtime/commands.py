"""Commands over NATS request/reply (`chamber.cmd.<service>.<verb>`), served with FastStream.

FastStream fits here: plain core-NATS subscribers with queue groups and replies. (JetStream
consumption stays on nats-py in `consumer.py`: FastStream's pull subscriber measured ~850 msgs/s.)

A reply is always JSON: `{"ok": true, "result": ...}` or `{"ok": false, "error": "...", "field": ...}`.
A bad request is refused with a message naming the field; it never goes unanswered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
import nats.errors
from faststream.nats import NatsBroker, NatsMessage
from faststream.security import SASLPlaintext
from nats.aio.client import Client

from events import subjects
from events.names import InvalidName, decode_request
from services.runtime.connection import server_urls
from services.runtime.credentials import inbox_prefix, login, user_of
from services.runtime.logs import get_logger
from services.runtime.tracing import client_span, command_span, current_traceparent

log = get_logger("chamber.runtime.commands")

T = TypeVar("T")
S = TypeVar("S")
R = TypeVar("R")


# Why a command was refused, so an HTTP client gets the status that tells it what to do next:
# fix the request (invalid: 422), re-read and retry (conflict: 409), retry later (catching_up: 503),
# or look elsewhere (unknown: 404).
REFUSAL_KINDS = ("invalid", "conflict", "catching_up", "unknown")


class CommandRefused(Exception):
    """The command is wrong or not allowed now; `field` names the part to fix, `kind` is one of
    REFUSAL_KINDS."""

    def __init__(self, message: str, *, field: str | None = None, kind: str = "invalid") -> None:
        super().__init__(message)
        self.field = field
        self.kind = kind if kind in REFUSAL_KINDS else "invalid"


class CommandConflict(Exception):
    """An append refused by the stream: the entity's subject is not at the expected sequence."""


class CommandUnavailable(Exception):
    """No service answered (not running, or NATS unreachable)."""


class CommandTimedOut(CommandUnavailable):
    """Someone may be there, but no answer came within the request's timeout."""


@dataclass(frozen=True)
class Append:
    """One event a command records. `expected_seq`: the last sequence of the entity's subject the
    command was checked against (0: the entity is new); the stream refuses the append when the subject
    has moved on since, and the requester is told `conflict`. None: no check (a fleet-wide setting)."""

    event: Any  # events.Event
    id: str
    expected_seq: int | None = None
    conflict: str = ""
    field: str | None = None  # the request's field the conflict is about


@dataclass(frozen=True)
class Accepted:
    """What a valid change records, and the answer sent once every append is folded back.
    `if_conflict`: a retry of a change already applied (same request id) answers this instead of
    being refused."""

    appends: tuple[Append, ...]
    result: Any = None
    if_conflict: Any = None


class FromLog(Exception):
    """Raised by `validate` or `answer`: the entity has left memory (a finished job), and the answer is
    in its first and last events on `subject`; the host reads them and calls the command's `from_log`.
    `unknown`: the refusal when the log has no such entity either (and `field`, the field it names)."""

    def __init__(self, stream: str, subject: str, unknown: str, field: str | None = None) -> None:
        super().__init__(subject)
        self.stream, self.subject, self.unknown, self.field = stream, subject, unknown, field


@dataclass(frozen=True)
class Command(Generic[S, R]):
    """A verb of a decider's manifest, served by the host (`services/runtime/command_path.py`).

    Exactly one of `validate` (a change: pure, `(state, request, now) -> Accepted`, raises
    CommandRefused or InvalidName) and `answer` (a read: pure, `(state, request, now) -> result`).
    `entity(state, request)`: the (stream, subject) a per-entity change acts on; the host reads the
    subject's last sequence, waits until it is folded, and passes it as the request's `expected_seq`
    when the requester did not give the one it read. `conflict(request)`: what a per-entity change is
    told when the entity moved on since `expected_seq` (before validating, or when the stream refuses
    the append), and `conflict_field` the field it names. `from_log(request, first, last)`: the answer
    from an entity's first and last events in its stream (see FromLog)."""

    verb: str
    request: type[R]
    validate: Callable[[S, R, float], Accepted] | None = None
    answer: Callable[[S, R, float], Any] | None = None
    entity: Callable[[S, R], tuple[str, str] | None] | None = None
    conflict: Callable[[R], str] | None = None
    conflict_field: str | None = None
    from_log: Callable[[R, Any, Any], Any] | None = None  # (request, first event, last event)

    def __post_init__(self) -> None:
        if (self.validate is None) == (self.answer is None):
            raise ValueError(f"command {self.verb!r}: give exactly one of validate (a change) or answer (a read)")


class CommandReply(msgspec.Struct, omit_defaults=True):
    ok: bool
    result: Any = None
    error: str | None = None
    field: str | None = None
    kind: str | None = None  # a refusal's kind (REFUSAL_KINDS); absent: invalid


_encoder = msgspec.json.Encoder()
# NATS's default max_payload is 1 MiB; a reply above it is dropped by the server and the requester
# would only see a timeout. Replies stay under this, or say why they cannot.
MAX_REPLY_BYTES = 1024 * 1024 - 4096


def _reply(**kw: Any) -> bytes:
    return _encoder.encode(CommandReply(**kw))


def page_of_rows(
    rows: list[Any], *, offset: int = 0, limit: int | None = None, key: str = "jobs", budget: int = MAX_REPLY_BYTES // 2
) -> dict[str, Any]:
    """One page of rows that fits in a reply: at most `limit` rows from `offset`, and never more than
    `budget` encoded bytes. `next_offset` is set when rows are left, so a client can ask for the rest."""
    page: list[Any] = []
    size = 0
    end = len(rows) if limit is None else min(len(rows), offset + limit)
    for row in rows[offset:end]:
        size += len(_encoder.encode(row)) + 1
        if page and size > budget:
            break
        page.append(row)
    answer: dict[str, Any] = {key: page, "total": len(rows), "offset": offset}
    if offset + len(page) < len(rows):
        answer["next_offset"] = offset + len(page)
    return answer


def reply_too_large(service: str, verb: str, size: int) -> bytes:
    return _reply(
        ok=False,
        error=f"the answer of {service}.{verb} is {size} bytes, over NATS's max payload ({MAX_REPLY_BYTES}); "
        "ask for less (a smaller --limit, or a page with --offset)",
        field="limit",
    )


class _OnServiceConnection(NatsBroker):
    """FastStream on the service's own NATS client: one connection per process (one login, one
    reconnect policy, one entry in the server's connection list) for its events and its commands.
    FastStream has no public way to be handed a client; `_connect` is where it makes its own (0.7,
    hence the version pin), so this hands it ours instead, and leaves draining it to its owner."""

    def __init__(self, nc: Client, **options: Any) -> None:
        super().__init__(**options)
        self._service_nc = nc

    async def _connect(self) -> Client:
        self.config.connect(self._service_nc)
        return self._service_nc

    async def stop(self, *exc: Any) -> None:
        self._connection = None  # the service host drains its client after its consumers
        await super().stop(*exc)


class CommandServer:
    """Register verbs, then `start()`. One queue group per service, so replicas share the load.
    With `nc` (a service host's own client) the verbs are served on that connection; without (the
    node agent's simulated fault injection), FastStream opens one of its own with the same login."""

    def __init__(self, url: str, service: str, *, nc: Client | None = None) -> None:
        self.service = service
        if nc is not None:
            self.broker: NatsBroker = _OnServiceConnection(nc, logger=None)
            return
        servers = server_urls(url)
        credentials = login(servers)
        security = SASLPlaintext(credentials["user"], credentials["password"]) if credentials else None
        user = user_of(servers, credentials)
        self.broker = NatsBroker(
            servers,
            name=f"chamber-{service}-commands",
            logger=None,
            max_reconnect_attempts=-1,
            security=security,
            inbox_prefix=inbox_prefix(user) if user else "_INBOX",  # its role's only inbox
        )

    def register(self, verb: str, request_type: type[T], handler: Callable[[T], Awaitable[Any]]) -> None:
        async def raw_body(msg: NatsMessage) -> Any:
            return msg.body, dict(msg.headers or {})

        async def serve(message: Any) -> bytes:
            body, headers = message
            with command_span(headers, service=self.service, verb=verb):
                return await answer(body)

        async def answer(body: bytes) -> bytes:
            try:
                request = decode_request(body, request_type)
            except InvalidName as exc:
                return _reply(ok=False, error=str(exc), field=exc.field)
            try:
                result = await handler(request)
            except InvalidName as exc:  # a handler's own check of the event it would publish
                return _reply(ok=False, error=str(exc), field=exc.field)
            except CommandRefused as exc:
                kind = None if exc.kind == "invalid" else exc.kind
                return _reply(ok=False, error=str(exc), field=exc.field, kind=kind)
            except Exception as exc:  # a bug must still answer, and not kill the server
                log.exception("command failed", service=self.service, verb=verb)
                return _reply(ok=False, error=f"internal error in {self.service}.{verb}: {type(exc).__name__}: {exc}")
            encoded = _reply(ok=True, result=result)
            if len(encoded) > MAX_REPLY_BYTES:
                return reply_too_large(self.service, verb, len(encoded))
            return encoded

        self.broker.subscriber(subjects.command(self.service, verb), queue=f"chamber-{self.service}", decoder=raw_body)(
            serve
        )

    async def start(self) -> None:
        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()


async def request(nc: Client, service: str, verb: str, payload: Any, *, timeout: float = 5.0) -> Any:
    """Send a command and return its result; raises CommandRefused or CommandUnavailable."""
    subject = subjects.command(service, verb)
    with client_span(service, verb):  # the command's trace; the events it causes continue it
        traceparent, tracestate = current_traceparent()
    headers = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v}
    try:
        msg = await nc.request(subject, _encoder.encode(payload), timeout=timeout, headers=headers or None)
    except nats.errors.NoRespondersError:
        raise CommandUnavailable(f"no {service} service is answering on {subject}: is it running?") from None
    except nats.errors.MaxPayloadError:
        size = len(_encoder.encode(payload))
        raise CommandRefused(
            f"the request is {size} bytes, over the NATS server's max payload ({nc.max_payload}); send less"
        ) from None
    except nats.errors.TimeoutError:
        raise CommandTimedOut(
            f"{service} did not answer {subject} within {timeout:g}s (it may be busy or stopped; "
            "`chamber health` shows what is running)"
        ) from None
    reply = msgspec.json.decode(msg.data, type=CommandReply)
    if not reply.ok:
        raise CommandRefused(reply.error or "refused", field=reply.field, kind=reply.kind or "invalid")
    return reply.result
