"""Snapshots that survive a deploy: a core's facts, encoded with msgspec under its `STATE_VERSION`.

A snapshot is named by the core's state type and the version the core declares (`STATE_VERSION` in
its module), never by the source of the build that wrote it: a release that changes a comment, a
log line or how fast a cache is rebuilt restores the last snapshot; a release that changes what the
fold *means* bumps the version, and its first start folds the log from the start.

Only facts travel: fields named in `caches` (indexes, memos, anything the core derives from its
facts) are left out, come back as their defaults, and `rebuild` derives them again after loading.
msgspec decodes into the dataclass by field name, so a field added with a default reads an older
snapshot (the field starts at its default); the host adds a digest of the encoded initial state to
the format (decider.snapshot_format), so a snapshot taken under other settings is still refused.
"""

from __future__ import annotations

import collections
import dataclasses
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from services.runtime.decider import SnapshotCodec

S = TypeVar("S")


def facts_codec(
    state_type: type[S],
    *,
    version: int,
    caches: Sequence[str] = (),
    rebuild: Callable[[S], object] | None = None,
) -> SnapshotCodec[S]:
    """A msgspec codec of the dataclass `state_type` without its `caches`; `rebuild(state)` runs on
    every decoded state (it may fill the caches in place)."""
    if not dataclasses.is_dataclass(state_type):
        raise TypeError(f"{state_type.__name__} is not a dataclass")
    fields = [f.name for f in dataclasses.fields(state_type)]
    unknown = sorted(set(caches) - set(fields))
    if unknown:
        raise ValueError(f"{state_type.__name__} has no field {unknown}")
    facts = [name for name in fields if name not in caches]
    encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
    decoder = msgspec.msgpack.Decoder(type=state_type, dec_hook=_dec_hook)
    templates = _container_templates(state_type)

    def encode(state: S) -> bytes:
        return encoder.encode({name: getattr(state, name) for name in facts})

    def decode(data: bytes) -> S:
        state = decoder.decode(data)
        for name, template in templates.items():  # a bounded deque keeps its bound, a defaultdict its factory
            setattr(state, name, _like(template, getattr(state, name)))
        if rebuild is not None:
            rebuild(state)
        return state

    return SnapshotCodec(format=f"msgspec-{state_type.__name__}-v{version}", encode=encode, decode=decode)


def _enc_hook(value: Any) -> Any:
    if isinstance(value, collections.deque):
        return list(value)
    raise NotImplementedError(f"a snapshot cannot hold {type(value).__name__}")


def _dec_hook(kind: Any, value: Any) -> Any:
    """deque and OrderedDict, which msgspec does not decode itself; their items typed as declared."""
    origin, args = typing.get_origin(kind) or kind, typing.get_args(kind)
    if origin is collections.deque:
        items: Any = list.__class_getitem__(args) if args else list  # list[item type]
        return collections.deque(msgspec.convert(value, items, dec_hook=_dec_hook))
    if origin is collections.OrderedDict:
        pairs: Any = dict.__class_getitem__(args) if args else dict  # dict[key type, value type]
        return collections.OrderedDict(msgspec.convert(value, pairs, dec_hook=_dec_hook))
    raise NotImplementedError(f"a snapshot cannot hold {kind}")


def _container_templates(state_type: type) -> dict[str, Any]:
    """Fields whose default is a bounded deque or a defaultdict: the decoded value is re-wrapped like it."""
    out = {}
    for f in dataclasses.fields(state_type):
        if f.default_factory is not dataclasses.MISSING:
            template = f.default_factory()
            if isinstance(template, collections.defaultdict) or (
                isinstance(template, collections.deque) and template.maxlen is not None
            ):
                out[f.name] = template
    return out


def _like(template: Any, value: Any) -> Any:
    if isinstance(template, collections.defaultdict):
        return collections.defaultdict(template.default_factory, value)
    return collections.deque(value, maxlen=template.maxlen)


def plain(value: Any) -> Any:
    """The state as msgspec sees it (builtins only): for tests comparing a restored state."""
    return msgspec.to_builtins(value, str_keys=True)
