"""The one command path of a decider host: every verb of a service's manifest (`Decider.commands`,
each a `commands.Command`) is served here, over FastStream request/reply (`commands.CommandServer`).

A request is decoded by its type (a bad field is refused, naming it), then:

1. wait until the host has caught up with its log (briefly); else refuse with one message, the same
   for every service: "<service> is catching up with its log (replaying: folded N of M); try again";
2. a read (`answer`) is answered from the folded state, `now` passed in;
3. a change (`validate`) is checked against the folded state; a per-entity change (`entity`) first
   has the entity's last sequence read from the stream and folded, and carries it (the one the
   requester read, if it gave one: `expected_seq`), so the stream refuses the append if anything
   reached the entity since: of two concurrent changes exactly one wins, the other is told so;
4. the events are appended (`Nats-Expected-Last-Subject-Sequence` for a per-entity change) and the
   answer is sent once they are folded back, so the next command, on any replica, sees them.

Changes are checked and appended one at a time per process: each is validated against a state that
holds the one before it. A read of an entity that has left memory (a finished job) raises
`FromLog`, and is answered from the entity's first and last events in the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
from nats.js.errors import NotFoundError

from events.codec import decode
from services.runtime.commands import Accepted, Command, CommandConflict, CommandRefused, FromLog
from services.runtime.logs import get_logger

if TYPE_CHECKING:
    from services.runtime.decider import DeciderHost

S = TypeVar("S")
log = get_logger("chamber.runtime.commands")
CATCH_UP_WAIT_S = 3.0  # a command right after start waits this long for the log to be read


def catching_up(service: str, progress: str | None) -> str:
    """The one refusal of a command that came before the service caught up with its log."""
    return f"{service} is catching up with its log ({progress or 'replaying'}); try again in a moment"


def _conflict(command: Command[S, Any], request: Any) -> str:
    if command.conflict is not None:
        return command.conflict(request)
    return f"{command.verb}: what it changes changed since you read it (seq {request.expected_seq}); re-read and retry"


class CommandPath(Generic[S]):
    def __init__(self, host: DeciderHost[S]) -> None:
        self.host = host
        self._changes = asyncio.Lock()

    def install(self) -> None:
        ctx = self.host.ctx
        for command in self.host.decider.commands:
            ctx.command(command.verb, command.request, functools.partial(self.serve, command))

    async def serve(self, command: Command[S, Any], request: Any) -> Any:
        await self._wait_caught_up()
        try:
            if command.answer is not None:
                return command.answer(self.host.state, request, time.time())
            async with self._changes:
                return await self._change(command, request)
        except FromLog as gone:
            return await self._from_log(command, request, gone)

    async def _wait_caught_up(self) -> None:
        host = self.host
        if not host.ready:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(host.caught_up_event.wait(), CATCH_UP_WAIT_S)
        if not host.ready:
            raise CommandRefused(catching_up(host.decider.name, host.replaying()), kind="catching_up")

    async def _change(self, command: Command[S, Any], request: Any) -> Any:
        host = self.host
        assert command.validate is not None
        target = command.entity(host.state, request) if command.entity is not None else None
        if target is not None:
            stream, subject = target
            try:
                seq = await host.entity_seq(stream, subject)  # folded up to it when it returns
            except CommandConflict as exc:
                raise CommandRefused(str(exc), kind="conflict") from None
            read = getattr(request, "expected_seq", None)
            if read is None:
                request = msgspec.structs.replace(request, expected_seq=seq)
            elif read != seq:  # the requester read the entity before its latest change
                raise CommandRefused(_conflict(command, request), field=command.conflict_field, kind="conflict")
        accepted = command.validate(host.state, request, time.time())
        return await self._record(command, request, accepted)

    async def _record(self, command: Command[S, Any], request: Any, accepted: Accepted) -> Any:
        seq = None
        for append in accepted.appends:
            try:
                seq = await self.host.append(append.event, id=append.id, expected_subject_seq=append.expected_seq)
            except CommandConflict:
                if accepted.if_conflict is not None:
                    return accepted.if_conflict  # a retry of a change already made: applied once
                raise CommandRefused(
                    append.conflict or _conflict(command, request),
                    field=append.field or command.conflict_field,
                    kind="conflict",
                ) from None
        if accepted.appends:  # an operator's change, in the service's log with what it recorded
            events = [type(a.event).__name__ for a in accepted.appends]
            log.info("command applied", service=self.host.decider.name, verb=command.verb, events=events, seq=seq)
        result = accepted.result
        if seq is not None and isinstance(result, dict) and command.entity is not None:
            # the entity's sequence now: a requester that changes it again passes it as `expected_seq`
            result = {**result, "seq": seq}
        return result

    async def _from_log(self, command: Command[S, Any], request: Any, gone: FromLog) -> Any:
        js = self.host.ctx.js
        try:
            first = await js.get_msg(gone.stream, seq=1, subject=gone.subject, next=True)
            last = await js.get_last_msg(gone.stream, gone.subject)
        except NotFoundError:
            raise CommandRefused(gone.unknown, field=gone.field, kind="unknown") from None
        if command.from_log is None:
            raise CommandRefused(gone.unknown, field=gone.field, kind="unknown")
        return command.from_log(
            request, decode(first.headers, first.data or b"").event, decode(last.headers, last.data or b"").event
        )
