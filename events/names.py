"""One definition of names and limits, shared by event types, command handlers, the HTTP API and the CLI.

A value that passes these types at the door also passes every consumer of the event it becomes, so
nothing is acknowledged and then dead-lettered. msgspec checks the constraints when it decodes (not
when a Struct is built in code), so `check_event` runs an event through its own decoder before it is
published from a command.

Teams follow one rule, `normalize_team`: trimmed, lower-cased, then `[a-z0-9-]`, starting and ending
with a letter or digit, at most 63 characters (a DNS label, so a team is also a valid Kubernetes label
value and a subject token unchanged).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import msgspec

# -- limits ----------------------------------------------------------------------------------------
NAME_MAX = 253  # cluster, node, job id, pool, fault id: a DNS name's length
TEAM_MAX = 63  # a DNS label
LABEL_MAX = 256  # a job's display name
TEXT_MAX = 1024  # free text: reasons, "by", details
MODEL_MAX = 128  # a GPU model as NVML names it ("NVIDIA H100 80GB HBM3")
GPUS_PER_REPLICA_MAX = 1024
REPLICAS_MAX = 10_000
GPUS_MAX = 1_000_000  # guarantees, borrow and lend limits
SECONDS_MAX = 10 * 365 * 86400.0  # durations and intervals: ten years

TEAM_PATTERN = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
# No whitespace, no control characters (a NUL byte included), none of NATS's wildcards. Spelled so that
# Python's `re` (msgspec) and ECMA-262 (JSON Schema validators) agree: their `\s` differ on these.
NAME_PATTERN = r"^[^\s\x00-\x1f\x7f-\x9f\ufeff*>]+$"

# -- types -----------------------------------------------------------------------------------------
Name = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=NAME_MAX,
        pattern=NAME_PATTERN,
        description="an identifier: no whitespace, control characters, '*' or '>'",
    ),
]
Team = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=TEAM_MAX,
        pattern=TEAM_PATTERN,
        description="a team: lower-case letters, digits and '-', starting and ending with a letter or digit",
    ),
]
Label = Annotated[str, msgspec.Meta(max_length=LABEL_MAX)]
Text = Annotated[str, msgspec.Meta(max_length=TEXT_MAX)]
Model = Annotated[str, msgspec.Meta(min_length=1, max_length=MODEL_MAX)]
GpusPerReplica = Annotated[int, msgspec.Meta(ge=1, le=GPUS_PER_REPLICA_MAX)]
Replicas = Annotated[int, msgspec.Meta(ge=1, le=REPLICAS_MAX)]
GpuCount = Annotated[int, msgspec.Meta(ge=0, le=GPUS_MAX)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=SECONDS_MAX)]
SecondsOrZero = Annotated[float, msgspec.Meta(ge=0, le=SECONDS_MAX)]

_TEAM = re.compile(TEAM_PATTERN)


class InvalidName(ValueError):
    """A name or value that breaks the shared rules; `field` names the part to fix."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "…")


def normalize_team(value: str, *, field: str = "team") -> str:
    """The one team rule: trim, lower-case, then check. `Vision` and `vision ` are the team `vision`."""
    team = value.strip().lower()
    if not team:
        raise InvalidName(f"{field} is empty; give a team name such as 'vision'", field=field)
    if len(team) > TEAM_MAX:
        raise InvalidName(f"{field} is {len(team)} characters long; the limit is {TEAM_MAX}", field=field)
    if not _TEAM.match(team):
        raise InvalidName(
            f"{field} {_shown(value)} is not a team name: use lower-case letters, digits and '-', "
            "starting and ending with a letter or digit",
            field=field,
        )
    return team


def field_of(exc: msgspec.ValidationError) -> str | None:
    """The field a msgspec validation error is about (`$.spec.team` -> `spec.team`), if it says."""
    text = str(exc)
    unknown = re.search(r"unknown field `([^`]*)`", text)
    if unknown:
        return unknown.group(1)
    marker = "at `$."
    if marker not in text:
        return None
    path = text.split(marker, 1)[1].split("`", 1)[0]
    return re.sub(r"\[[^\]]*\]", "", path) or None


def check_event(event: msgspec.Struct) -> None:
    """Raise InvalidName if an event built in code would be refused by its consumers' decoder."""
    try:
        msgspec.json.decode(msgspec.json.encode(event), type=type(event))
    except msgspec.ValidationError as exc:
        raise InvalidName(f"{exc}", field=field_of(exc)) from None
    except (OverflowError, msgspec.EncodeError) as exc:
        raise InvalidName(f"a value is out of range: {exc}") from None


def _refuse_non_finite(value: Any, field: str = "") -> None:
    """NaN and infinity are not amounts: `--budget nan` must not quietly remove a budget."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidName(f"{field or 'value'}: {value} is not a finite number", field=field or None)
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _refuse_non_finite(getattr(value, name), name)
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_non_finite(item, field)
    elif isinstance(value, dict):
        for item in value.values():
            _refuse_non_finite(item, field)


def decode_request(body: bytes | Any, request_type: type[Any]) -> Any:
    """Decode a command's JSON body (bytes) or an already parsed object into its request type.

    Raises InvalidName naming the field: unknown fields, wrong types, values beyond the limits, and
    names that break the rules (the request types normalise in `__post_init__`).
    """
    try:
        if isinstance(body, bytes | bytearray | memoryview):
            decoded = msgspec.json.decode(body or b"{}", type=request_type)
        else:
            decoded = msgspec.convert(body, request_type)
        _refuse_non_finite(decoded)
        return decoded
    except InvalidName:
        raise
    except msgspec.ValidationError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, InvalidName):
            raise InvalidName(str(cause), field=cause.field) from None
        raise InvalidName(f"invalid request: {exc}", field=field_of(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidName(f"request is not valid JSON: {exc}") from None
