"""The snapshot encoding of the decider host: pickle, read back through an allow-list, named by build.

Why pickle and not msgspec: a core's state shares objects between its indexes (the scheduler's
nodes are in a dict and a list, its capacity slots point into them); pickle keeps that graph as it
is and loads it in one call, where a schema encoding would need a hand-written rebuild per core.

Why it is safe to load: a pickle can name any callable, so a plain `pickle.loads` of the snapshot
bucket would run whatever someone who can write to it put there. `SafeUnpickler` resolves only
classes of the service's own core, of `events` and of a fixed set of containers; anything else
(`os.system`, a function, a class elsewhere) refuses the whole snapshot, and the host replays the log
from the start instead.

Why "build": the format names the state's shape (dataclass fields) and a digest of the source of the
modules that define it and fold into it. A snapshot written by another build, even one with the same
fields, is refused (replayed from the start): a fold that changed its meaning must not inherit a
state built by the old one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import io
import pickle
import sys
from collections.abc import Iterable
from types import ModuleType
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


def build_digest(shapes: Iterable[type], modules: Iterable[ModuleType] = ()) -> str:
    """A digest of the state's fields and of the source of the modules that define and fold it."""
    h = hashlib.sha256()
    seen: set[str] = set()
    for cls in shapes:
        if dataclasses.is_dataclass(cls):
            h.update(f"{cls.__name__}:{','.join(f.name for f in dataclasses.fields(cls))}|".encode())
        for module in (sys.modules[cls.__module__], *modules):
            path = inspect.getsourcefile(module) or ""
            if path and path not in seen:
                seen.add(path)
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]
