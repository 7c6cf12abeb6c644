"""How much memory one analytics query may use in this process.

With the embedded warehouse (chDB) analytics SQL runs inside the recorder, next to ingest. A fixed
2 GiB per query is more than a recorder container is often given (the chart gives its recorder
1 GiB), so one heavy `chamber sql` by a read-only user was enough for the kernel to kill the
recorder and stop ingest. The budget is therefore taken from the memory limit of the process's own
cgroup (what Docker, Kubernetes or systemd set), a quarter of it shared by the query slots, and
never more than 2 GiB; where no limit is set it is 2 GiB, as before. (On a ClickHouse server the
server's analytics profile limits the query; the recorder does not apply this there.)
"""

from __future__ import annotations

from pathlib import Path

MAX_QUERY_BYTES = 2 * 1024**3  # with no container limit (a workstation, `chamber up`)
MIN_QUERY_BYTES = 32 * 1024**2  # below this the simplest report fails: an operator should raise the limit
SHARE_OF_LIMIT = 4  # analytics together may use a quarter of the container; ingest and the engine keep the rest
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def cgroup_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The smallest memory limit in bytes on this process's cgroup and its ancestors (cgroup v2
    `memory.max`, v1 `memory.limit_in_bytes`), or None when nothing limits it or it cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: "0::/kubepods/..."
            found += _walk(root, path, "memory.max")
        elif "memory" in controllers.split(","):  # v1: "4:memory:/kubepods/..."
            found += _walk(root / "memory", path, "memory.limit_in_bytes")
    limits = [b for b in found if b < _UNLIMITED]
    return min(limits) if limits else None


def _walk(base: Path, path: str, name: str) -> list[int]:
    """The limit file's values from the cgroup at `path` up to the mount's root (inside a container
    with its own cgroup namespace the path is "/" and the root is the container's cgroup)."""
    values = []
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    for depth in range(len(parts), -1, -1):
        try:
            text = (base.joinpath(*parts[:depth]) / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            values.append(int(text))
    return values


def query_memory_bytes(limit: int | None, slots: int) -> int:
    """One analytics query's memory limit: a quarter of the container's `limit` over the `slots`
    that may run at once, between 32 MiB and 2 GiB; 2 GiB without a limit."""
    if limit is None:
        return MAX_QUERY_BYTES
    return max(MIN_QUERY_BYTES, min(MAX_QUERY_BYTES, limit // (SHARE_OF_LIMIT * max(1, slots))))


def size_text(n: int) -> str:
    """Bytes in the unit an operator sets them in: GiB from 1 GiB up, else MiB."""
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
