"""The snapshot encoding of the decider host: pickle, read back through an allow-list, named by build.

Why pickle and not msgspec: a core's state shares objects between its indexes (the scheduler's
nodes are in a dict and a list, its capacity slots point into them); pickle keeps that graph as it
is and loads it in one call, where a schema encoding would need a hand-written rebuild per core.

Why it is safe to load: a pickle can name any callable, so a plain `pickle.loads` of the snapshot
bucket would run whatever someone who can write to it put there. `SafeUnpickler` resolves only
classes of the service's own core, of `events` and of a fixed set of containers; anything else
(`os.system`, a function, a class elsewhere) refuses the whole snapshot, and the host replays the log
from the start instead.

Why a version: the format names the state's shape (its classes' fields) and the version the core
declares (`STATE_VERSION`), never the source of the build: a release that only changes a comment
restores the last snapshot; one that changes the fold's meaning bumps the version and folds from
the start. (The cores whose state is plain data use state_codec.py's msgspec codec instead.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import pickle
from collections.abc import Iterable
from typing import Any

# Containers and scalars a state may hold, by (module, name).
SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {("builtins", n) for n in ("set", "frozenset", "float", "int", "str", "bytes", "bytearray", "list", "dict")}
    | {("builtins", n) for n in ("tuple", "bool", "complex", "slice")}
    | {("collections", n) for n in ("deque", "defaultdict", "OrderedDict", "Counter")}
    | {("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")}
    # msgspec's `rebuild(cls, kwargs)` is `cls(**kwargs)`: how a kw-only Struct (an event) unpickles;
    # `cls` itself goes through the allow-list
    | {("msgspec._utils", "rebuild")}
)
SHARED_PACKAGES = ("events", "services.pools")  # event payloads and pool rules kept in states


class RefusedSnapshot(pickle.UnpicklingError):
    """The snapshot names something outside the allow-list: it is not loaded."""


class SafeUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, packages: Iterable[str]) -> None:
        super().__init__(io.BytesIO(data))
        self.packages = tuple(packages)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            return getattr(importlib.import_module(module), name)
        if any(module == p or module.startswith(p + ".") for p in self.packages) and "." not in name:
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type):  # classes only: a function could do anything with its arguments
                return found
        raise RefusedSnapshot(f"the snapshot names {module}.{name}, which a state never holds")


def safe_loads(data: bytes, packages: Iterable[str]) -> Any:
    return SafeUnpickler(data, packages).load()


def packages_of(shapes: Iterable[type]) -> tuple[str, ...]:
    """The packages a state's classes come from (the core's package) plus the shared ones."""
    own = {c.__module__.rsplit(".", 1)[0] if c.__module__.count(".") >= 2 else c.__module__ for c in shapes}
    return (*sorted(own), *SHARED_PACKAGES)


def shape_digest(shapes: Iterable[type]) -> str:
    """A digest of the state classes' names and fields: a class that gained or lost a field does not
    unpickle into a state the fold expects. The source is not in it (a comment changes nothing)."""
    h = hashlib.sha256()
    for cls in shapes:
        names = ",".join(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ""
        h.update(f"{cls.__module__}.{cls.__qualname__}:{names}|".encode())
    return h.hexdigest()[:16]
