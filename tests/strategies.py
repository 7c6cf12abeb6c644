"""Hypothesis strategies for any event type, derived from its msgspec type annotations."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import msgspec
from hypothesis import strategies as st

from events.base import Event

_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        base, *metas = args
        meta = next((m for m in metas if isinstance(m, msgspec.Meta)), None)
        if meta is not None and base is int:
            high = meta.le if meta.le is not None else 2**53
            return st.integers(min_value=meta.ge if meta.ge is not None else None, max_value=high)
        if meta is not None and base is float:
            low = meta.ge if meta.ge is not None else meta.gt
            return st.floats(
                min_value=low, max_value=meta.le, exclude_min=meta.gt is not None, allow_nan=False, allow_infinity=False
            )
        if meta is not None and base is str:
            low, high = meta.min_length or 0, min(meta.max_length or 20, 20)
            if meta.pattern:
                return st.from_regex(meta.pattern).filter(lambda s: low <= len(s) <= high)
            return st.text(min_size=low, max_size=high).filter(lambda s: s.strip() or not low)
        return for_type(base)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(for_type(a) for a in args))
    if origin is list:
        return st.lists(for_type(args[0]), max_size=3)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(for_type(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(for_type(args[0]), for_type(args[1]), max_size=3)
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(min_value=-(2**53), max_value=2**53)
    if tp is float:
        return _FLOATS
    if tp is str:
        return st.text(max_size=20)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return struct_of(tp)
    raise NotImplementedError(f"no strategy for {tp!r}")


def struct_of(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: for_type(hints[f.name]) for f in msgspec.structs.fields(cls)}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


def any_event(classes: tuple[type[Event], ...]) -> st.SearchStrategy[Event]:
    return st.one_of(*(struct_of(c) for c in classes))
