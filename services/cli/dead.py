"""`chamber dead list|show|replay`: the dead letters (stream DEAD) with their reasons, and putting
chosen ones back on their original subject once the cause is fixed.

A replay publishes the original bytes and headers (without the reason headers, and without the
JetStream checks that held for the original: services/runtime/dead_letter.py `replay_headers`) on
the subject the message first came on, so every consumer of that stream sees it again. Messages keep
their event id, so a consumer that stored it already skips it. The dead letter itself stays in DEAD.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from services.cli.common import add_nats_option, with_nats
from services.cli.errors import UsageError
from services.cli.tables import table
from services.runtime.dead_letter import (
    DEAD_CONSUMER,
    DEAD_DETAIL,
    DEAD_REASON,
    DEAD_STREAM_SEQ,
    DEAD_SUBJECT,
    replay_headers,
)

STREAM = "DEAD"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dead", help="dead letters: list them with their reasons, show one, replay after a fix")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="dead letters, newest last")
    _filters(ls)
    ls.add_argument("--limit", type=int, default=100, help="at most this many, the newest (default 100)")
    show = verbs.add_parser("show", help="one dead letter: headers and body")
    show.add_argument("seq", type=int, help="its sequence in DEAD (the first column of `chamber dead list`)")
    replay = verbs.add_parser("replay", help="republish dead letters on their original subjects")
    replay.add_argument("seqs", type=int, nargs="*", metavar="SEQ", help="these (or every one the filters match)")
    _filters(replay)
    replay.add_argument("--all", action="store_true", help="every dead letter the filters match")
    for verb in (ls, show, replay):
        add_nats_option(verb)
        verb.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream", help="only those from this stream (JOBS, TELEMETRY, ...)")
    p.add_argument("--reason", help="only those with this reason (malformed, handler_failed, ...)")


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    subject: str  # where it first came on
    stream_seq: int
    reason: str
    detail: str
    consumer: str
    headers: dict[str, str]
    data: bytes

    def summary(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "stream": self.source_stream,
            "subject": self.subject,
            "stream_seq": self.stream_seq,
            "reason": self.reason,
            "detail": self.detail,
            "consumer": self.consumer,
            "bytes": len(self.data),
        }

    @property
    def source_stream(self) -> str:
        from events.streams import stream_for

        spec = stream_for(self.subject)
        return spec.name if spec is not None else "?"


def _letter(msg: Any) -> DeadLetter:
    h = dict(msg.headers or {})
    return DeadLetter(
        seq=msg.seq,
        subject=h.get(DEAD_SUBJECT, ""),
        stream_seq=int(h.get(DEAD_STREAM_SEQ, "0") or 0),
        reason=h.get(DEAD_REASON, ""),
        detail=h.get(DEAD_DETAIL, ""),
        consumer=h.get(DEAD_CONSUMER, ""),
        headers=h,
        data=msg.data or b"",
    )


async def _read(nc: Any, seqs: list[int] | None, limit: int | None) -> list[DeadLetter]:
    from nats.js.errors import NotFoundError

    js = nc.jetstream()
    state = (await js.stream_info(STREAM)).state
    if seqs is None:
        first = state.first_seq or 1
        last = state.last_seq or 0
        wanted = list(range(max(first, last - limit + 1) if limit else first, last + 1))
    else:
        wanted = seqs
    out = []
    for seq in wanted:
        try:
            out.append(_letter(await js.get_msg(STREAM, seq)))
        except NotFoundError:
            if seqs is not None:
                raise UsageError(f"no dead letter {seq} (see `chamber dead list`)") from None
    return out


def _matches(letter: DeadLetter, args: argparse.Namespace) -> bool:
    stream = getattr(args, "stream", None)
    reason = getattr(args, "reason", None)
    return (not stream or letter.source_stream == stream.upper()) and (not reason or letter.reason == reason)


def printable(text: str) -> str:
    """`text` with control characters escaped (a message's bytes must not drive the terminal)."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def run(args: argparse.Namespace) -> int:
    if args.verb == "list":
        if args.limit < 1:
            raise UsageError("--limit must be at least 1")
        letters = [x for x in with_nats(args, lambda nc: _read(nc, None, None)) if _matches(x, args)][-args.limit :]
        if args.json:
            print(json.dumps({"dead_letters": [x.summary() for x in letters]}, indent=2))
            return 0
        if not letters:
            print("no dead letters")
            return 0
        rows = [
            (str(s["seq"]), s["stream"], printable(s["reason"]), printable(s["subject"]), printable(s["detail"])[:100])
            for s in (x.summary() for x in letters)
        ]
        print(table(("SEQ", "STREAM", "REASON", "SUBJECT", "DETAIL"), rows, align="rllll"))
        return 0
    if args.verb == "show":
        [letter] = with_nats(args, lambda nc: _read(nc, [args.seq], None))
        if args.json:
            print(
                json.dumps(
                    {**letter.summary(), "headers": letter.headers, "body": letter.data.decode(errors="replace")}
                )
            )
            return 0
        for key, value in letter.summary().items():
            print(f"{key:<11} {printable(str(value))}")
        print("headers:")
        for key, value in sorted(letter.headers.items()):
            print(f"  {printable(key)}: {printable(value)}")
        print("body:")
        print(printable(letter.data.decode(errors="replace")))
        return 0
    return _replay(args)


def _replay(args: argparse.Namespace) -> int:
    if not args.seqs and not args.all:
        raise UsageError("name the dead letters to replay (SEQ ...), or pass --all (with --stream/--reason to narrow)")

    async def replay(nc: Any) -> list[dict[str, Any]]:
        letters = [x for x in await _read(nc, args.seqs or None, None) if _matches(x, args)]
        js = nc.jetstream()
        done = []
        for x in letters:
            if not x.subject:
                raise UsageError(f"dead letter {x.seq} does not say where it came from; it cannot be replayed")
            ack = await js.publish(x.subject, x.data, headers=replay_headers(x.headers))
            done.append(
                {
                    "seq": x.seq,
                    "subject": x.subject,
                    "stream": ack.stream,
                    "new_seq": ack.seq,
                    "duplicate": ack.duplicate,
                }
            )
        return done

    done = with_nats(args, replay, name="chamber-dead-replay")
    if args.json:
        print(json.dumps({"replayed": done}))
    else:
        for d in done:
            # within the stream's duplicate window the original is still there: JetStream keeps that one
            note = " (a duplicate of a message the stream still holds: not stored again)" if d["duplicate"] else ""
            print(f"dead letter {d['seq']} -> {printable(d['subject'])} ({d['stream']} seq {d['new_seq']}){note}")
        print(f"{len(done)} replayed")
    return 0
