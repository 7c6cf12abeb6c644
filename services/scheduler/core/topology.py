"""Topology-aware gang placement helpers (pure): when no single switch domain (e.g. one leaf) has room
for a gang, spread it over the FEWEST domains rather than over whichever nodes come first, so its
collectives cross as few switch hops as possible (Kueue's topology-aware scheduling, one level).

Greedy by free GPUs, largest first: the fewest domains whose free GPUs add up to the need (taking the
largest first is optimal for the count). Ties break on the domain name, so placements are deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping


def fewest_domains(groups: Mapping[str, tuple[int, set[int]]], need: int) -> set[int] | None:
    """Node ids of the fewest domains whose free GPUs cover `need` (None: all of them together cannot).

    `groups` maps a domain (label value) to (free GPUs usable by the gang there, node ids)."""
    chosen: set[int] = set()
    have = 0
    for _, domain in sorted((-free, domain) for domain, (free, _) in groups.items()):
        free, members = groups[domain]
        if free <= 0:
            break
        chosen |= members
        have += free
        if have >= need:
            return chosen
    return None
