"""Link health as the scheduler knows it (pure): which nodes have a degraded NIC and which leaf
switches are congested now, so multi-node gangs are placed away from them (placement.py).

Two inputs, both folded by `evolve` in the one order the decider host gives:

- the perf service's verdicts on JOBS: `JobSlowdownDetected` with culprit `nic` flags the culprit's
  node, with culprit `fabric` flags the leaf switch (shared congestion); the verdict's
  `JobSlowdownCleared` (same job and episode) lifts the flag. A flag whose Cleared never comes (perf
  down) lapses after `SLOWDOWN_MEMORY_S`.
- the agents' NIC faults on FAULTS (`nic_down`, `nic_flap`, `nic_downshift`, `nic_errors`, and AMD's `xgmi`): raised
  once when a condition starts, with no "cleared" event, so each flags its node for
  `Policy.link_fault_memory_s` after it was observed.

Whether a flag is current is a function of the folded facts and the cycle's `now` (no clock read), so
a replay decides the same. GPU stragglers are not link faults: health isolates their GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from events.fabric import CulpritKind, JobSlowdownCleared, JobSlowdownDetected
from events.faults import FaultKind, GpuFaultDetected

LEAF_LABEL = "leaf"  # the node label naming a node's leaf switch (the simulator's and perf's)
SLOWDOWN_MEMORY_S = 6 * 3600.0  # a slowdown flag without its Cleared lapses after this long
KEEP_S = 6 * 3600.0  # NIC fault flags are forgotten this long after a newer one on the node (>= any memory)
DEFAULT_FAULT_MEMORY_S = 1800.0  # a NIC fault keeps its node off gangs this long (Policy.link_fault_memory_s)
NIC_FAULTS = frozenset({FaultKind.NIC_DOWN, FaultKind.NIC_FLAP, FaultKind.NIC_DOWNSHIFT, FaultKind.NIC_ERRORS})
# An AMD GPU's XGMI link down is a fabric fault too: the node's collectives cross it (docs/amd.md).
LINK_FAULTS = NIC_FAULTS | {FaultKind.XGMI}

NodeKey = tuple[str, str]  # (cluster, node)


@dataclass
class LinkHealth:
    """Flags per node and per leaf: {source: (why, at)}. A source is a slowdown episode
    (`slowdown <job>#<n>`, until cleared) or a NIC fault (`fault <kind> gpu<i>`, for a while)."""

    nodes: dict[NodeKey, dict[str, tuple[str, float]]] = field(default_factory=dict)
    leaves: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    episodes: dict[tuple[str, int], tuple[NodeKey | str, str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.leaves


def fold_slowdown(links: LinkHealth, e: JobSlowdownDetected) -> None:
    source = f"slowdown {e.job_id}#{e.episode}"
    if e.culprit == CulpritKind.NIC and e.node:
        key: NodeKey = (e.cluster or "", e.node)
        nic = f"NIC {e.nic}" if e.nic else "a NIC"
        links.nodes.setdefault(key, {})[source] = (f"{nic} slowed job {e.job_id} (speed {e.score:.2f})", e.at)
        links.episodes[(e.job_id, e.episode)] = (key, source)
    elif e.culprit == CulpritKind.FABRIC and e.leaf:
        why = f"congestion slowed job {e.job_id} (speed {e.score:.2f})"
        links.leaves.setdefault(e.leaf, {})[source] = (why, e.at)
        links.episodes[(e.job_id, e.episode)] = (e.leaf, source)


def fold_cleared(links: LinkHealth, e: JobSlowdownCleared) -> None:
    found = links.episodes.pop((e.job_id, e.episode), None)
    if found is None:
        return
    where, source = found
    table: dict = links.nodes if isinstance(where, tuple) else links.leaves  # type: ignore[type-arg]
    flags = table.get(where, {})
    flags.pop(source, None)
    if not flags:
        table.pop(where, None)


def fold_fault(links: LinkHealth, e: GpuFaultDetected) -> None:
    """A NIC fault flags its node; the node's fault flags older than `KEEP_S` before it are dropped
    (memory stays bounded; the newest observation of a source wins, whatever the fold order)."""
    if e.kind not in LINK_FAULTS:
        return
    key: NodeKey = (e.cluster, e.node)
    flags = links.nodes.setdefault(key, {})
    source = f"fault {e.kind.value} gpu{e.gpu_index}"
    old = flags.get(source)
    if old is None or old[1] <= e.observed_at:
        rail = f" (rail of GPU {e.gpu_index})" if e.gpu_index is not None else ""
        flags[source] = (f"{e.kind.value}{rail}" + (f": {e.detail}" if e.detail else ""), e.observed_at)
    for s in [s for s, (_, at) in flags.items() if s.startswith("fault ") and at < e.observed_at - KEEP_S]:
        del flags[s]


def _current(flags: dict[str, tuple[str, float]], now: float, fault_memory_s: float) -> str | None:
    """The first current flag's reason (sources in name order: deterministic), or None."""
    for source in sorted(flags):
        why, at = flags[source]
        memory = fault_memory_s if source.startswith("fault ") else SLOWDOWN_MEMORY_S
        if now - at <= memory:
            return why
    return None


class _Node(Protocol):
    nid: int
    labels: dict[str, str]


def degraded(
    links: LinkHealth, nodes: Mapping[NodeKey, _Node], fleet: Sequence[_Node], now: float, fault_memory_s: float
) -> dict[int, str]:
    """Node id -> why gangs should avoid it now: a degraded NIC on the node, or its leaf congested.
    Scans the fleet's labels only when some leaf is flagged."""
    out: dict[int, str] = {}
    for key, flags in links.nodes.items():
        node = nodes.get(key)
        if node is not None and (why := _current(flags, now, fault_memory_s)) is not None:
            out[node.nid] = why
    hot = {leaf: why for leaf, flags in links.leaves.items() if (why := _current(flags, now, fault_memory_s))}
    if hot:
        for node in fleet:
            leaf = node.labels.get(LEAF_LABEL)
            if leaf in hot and node.nid not in out:
                out[node.nid] = f"leaf {leaf} congested: {hot[leaf]}"
    return out
