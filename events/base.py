"""The base of every event: a frozen, tagged msgspec Struct whose tag is its CloudEvents type."""

from __future__ import annotations

import re

import msgspec

from events import names

CE_TYPE_PREFIX = "io.chamber"
# An identifier that becomes a subject token (cluster, node, job, pool, fault id); teams are `Team`.
# Both, and every other limit, are defined once in events/names.py.
Name = names.Name

_CE_TYPE = re.compile(r"^io\.chamber\.(?P<domain>[a-z]+)\.(?P<name>[a-z_]+)\.v(?P<major>[1-9][0-9]*)$")


def event_type(domain: str, name: str, major: int = 1) -> str:
    """The CloudEvents `type` of an event: `io.chamber.<domain>.<name>.v<major>`."""
    value = f"{CE_TYPE_PREFIX}.{domain}.{name}.v{major}"
    if not _CE_TYPE.match(value):
        raise ValueError(f"invalid event type {value!r}")
    return value


def parse_event_type(value: str) -> tuple[str, str, int] | None:
    """Split a CloudEvents type into (domain, name, major), or None if it is not one of ours."""
    match = _CE_TYPE.match(value)
    if match is None:
        return None
    return match["domain"], match["name"], int(match["major"])


# gc=False (inherited by every event): an event is frozen data (strings, numbers, and lists, dicts
# and structs of those), so it can never be part of a reference cycle; untracked, the events a cycle
# makes or a fold decodes are not walked by the cyclic garbage collector (services/runtime/collector.py).
class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """Every event on the wire. Subclasses set `tag=event_type(...)`.

    Fields may only be added with defaults; a breaking change is a new major type.
    Times are float Unix seconds so cores and the simulator can run on a virtual clock.
    """

    @classmethod
    def ce_type(cls) -> str:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str), f"{cls.__name__} has no event type tag"
        return tag

    @classmethod
    def domain(cls) -> str:
        parsed = parse_event_type(cls.ce_type())
        assert parsed is not None
        return parsed[0]
