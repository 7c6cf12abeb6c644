"""Commands over NATS request/reply (`chamber.cmd.<service>.<verb>`), served with FastStream.

FastStream fits here: plain core-NATS subscribers with queue groups and replies. (JetStream
consumption stays on nats-py in `consumer.py`: FastStream's pull subscriber measured ~850 msgs/s.)

A reply is always JSON: `{"ok": true, "result": ...}` or `{"ok": false, "error": "...", "field": ...}`.
A bad request is refused with a message naming the field; it never goes unanswered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import nats.errors
from faststream.nats import NatsBroker, NatsMessage
from nats.aio.client import Client

from events import subjects
from services.runtime.connection import server_urls
from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.commands")

T = TypeVar("T")


class CommandRefused(Exception):
    """The command is wrong or not allowed now; `field` names the part to fix."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class CommandUnavailable(Exception):
    """No service answered (not running, or NATS unreachable)."""


class CommandReply(msgspec.Struct, omit_defaults=True):
    ok: bool
    result: Any = None
    error: str | None = None
    field: str | None = None


_encoder = msgspec.json.Encoder()


def _reply(**kw: Any) -> bytes:
    return _encoder.encode(CommandReply(**kw))


def _field_of(exc: msgspec.ValidationError) -> str | None:
    text = str(exc)
    marker = "at `$."
    if marker in text:
        return text.split(marker, 1)[1].rstrip("`").split("[")[0].split(".")[0]
    return None


class CommandServer:
    """Register verbs, then `start()`. One queue group per service, so replicas share the load."""

    def __init__(self, url: str, service: str) -> None:
        self.service = service
        self.broker = NatsBroker(
            server_urls(url), name=f"chamber-{service}-commands", logger=None, max_reconnect_attempts=-1
        )

    def register(self, verb: str, request_type: type[T], handler: Callable[[T], Awaitable[Any]]) -> None:
        decoder = msgspec.json.Decoder(request_type)

        async def raw_body(msg: NatsMessage) -> bytes:
            return msg.body

        async def serve(body: bytes) -> bytes:
            try:
                request = decoder.decode(body or b"{}")
            except msgspec.ValidationError as exc:
                return _reply(ok=False, error=f"invalid request: {exc}", field=_field_of(exc))
            except msgspec.DecodeError as exc:
                return _reply(ok=False, error=f"request is not valid JSON: {exc}")
            try:
                result = await handler(request)
            except CommandRefused as exc:
                return _reply(ok=False, error=str(exc), field=exc.field)
            except Exception as exc:  # a bug must still answer, and not kill the server
                log.exception("command failed", service=self.service, verb=verb)
                return _reply(ok=False, error=f"internal error in {self.service}.{verb}: {type(exc).__name__}: {exc}")
            return _reply(ok=True, result=result)

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
    try:
        msg = await nc.request(subject, _encoder.encode(payload), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise CommandUnavailable(f"no {service} service is answering on {subject}: is it running?") from None
    except nats.errors.TimeoutError:
        raise CommandUnavailable(f"{service} did not answer {subject} within {timeout:g}s") from None
    reply = msgspec.json.decode(msg.data, type=CommandReply)
    if not reply.ok:
        raise CommandRefused(reply.error or "refused", field=reply.field)
    return reply.result
