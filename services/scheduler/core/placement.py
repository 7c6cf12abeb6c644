"""Cycle phase 3b: where a job's GPUs would come from (best fit, gangs whole, one topology domain first).

`place` takes GPUs on the cycle's scratch index; the caller keeps them (admit) or rolls back.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from services.scheduler.core import backfill, hostres, quota, shares
from services.scheduler.core.state import Job
from services.scheduler.core.topology import fewest_domains
from services.scheduler.core.work import Spot, Usage, Work


def could_fit(work: Work, job: Job) -> bool:
    """A cheap test from the index's counters, before the real placement."""
    cap = work.cap
    classes = work.classes(job)
    if job.spec.share is not None:
        return True  # room on a shared GPU is not in the counters: shares.place looks
    n = job.gpus
    if cap.free_in(classes) < n:
        return False
    if job.spec.replicas == 1:
        return cap.max_free(classes) >= n
    return cap.replicas_fit(classes, job.spec.gpus_per_replica) >= job.spec.replicas


def place(work: Work, job: Job) -> Spot | None:
    """`_place`, keeping off the node its pool holds for a protected whole-node job (`Drain`),
    unless the job may start there (backfill.held_from)."""
    if hostres.asks(job.spec) and hostres.of(work).left:
        return _host_bounded(work, job)
    return _place_held(work, job)


def _host_bounded(work: Work, job: Job) -> Spot | None:
    """`place` on the nodes whose CPU and memory left can hold the job's replicas (hostres.py)."""
    hidden = hostres.hide_full(work, job, work.classes(job))
    host = hostres.of(work)
    host.asking = job.spec if job.spec.share is not None else None  # shares.place takes per replica
    try:
        spot = _place_held(work, job)
    finally:
        host.asking = None
    for nid, gpus in reversed(hidden):
        work.cap.give(nid, gpus)
    if spot is not None and job.spec.share is None:
        hostres.taken(work, job, spot)
    return spot


def _place_held(work: Work, job: Job) -> Spot | None:
    found = shares.place if job.spec.share is not None else _place
    held = backfill.held_from(work, job) if work.drains else None
    if held is None or not work.cap.slots[held].free:
        return found(work, job)
    hidden = work.cap.take(held, len(work.cap.slots[held].free))  # journaled: given back below
    spot = found(work, job)
    work.cap.give(held, hidden)
    return spot


def _place(work: Work, job: Job) -> Spot | None:
    """Take GPUs for the job on the scratch index (the caller rolls back if it does not keep them).

    A job that fits on one node stays on one node (best fit); a larger gang is placed replica
    by replica, preferring one topology domain, then one cluster (a job never spans clusters).
    A gang across nodes keeps off degraded links and congested leaves (`work.avoid()`) when it fits
    elsewhere, and takes them only when nothing else fits; `work.link_notes[job.id]` says which."""
    cap = work.cap
    classes = work.classes(job)
    work.link_notes.pop(job.id, None)
    if not classes:
        return None
    per, replicas = job.spec.gpus_per_replica, job.spec.replicas
    n = per * replicas
    if n <= cap.max_gpus:
        nid = cap.best_fit(classes, n)
        if nid is not None:
            return [(nid, cap.take(nid, n))]
        if replicas == 1:
            return None
    if per > cap.max_gpus or cap.free_in(classes) < n:
        return None
    avoid = work.avoid()
    if avoid:
        # Hide the flagged nodes' free GPUs (journaled takes), place, then give them back: the
        # scratch index ends as if the gang had been placed on the others only.
        wanted = set(classes)
        hidden = [
            (nid, cap.take(nid, len(slot.free)))
            for nid in sorted(avoid)
            if (slot := cap.slots[nid]).usable and slot.free and slot.cls in wanted
        ]
        if hidden:
            spot = _spread(work, job, classes, per, replicas, n) if cap.free_in(classes) >= n else None
            for nid, gpus in reversed(hidden):
                cap.give(nid, gpus)
            names = work.s.node_by_id
            if spot is not None:
                kept = _listed([f"{names[nid].name}: {avoid[nid]}" for nid, _ in hidden])
                work.link_notes[job.id] = f"kept off degraded links ({kept})"
                return spot
            spot = _spread(work, job, classes, per, replicas, n)
            used = [nid for nid, _ in spot or () if nid in avoid]
            if used:
                on = _listed([f"{names[nid].name}: {avoid[nid]}" for nid in used])
                work.link_notes[job.id] = f"on degraded links because nothing else fits ({on})"
            return spot
    return _spread(work, job, classes, per, replicas, n)


def _listed(items: list[str], most: int = 3) -> str:
    more = f"; and {len(items) - most} more" if len(items) > most else ""
    return "; ".join(items[:most]) + more


def _spread(work: Work, job: Job, classes: list[int], per: int, replicas: int, n: int) -> Spot | None:
    """A gang across nodes: one topology domain first, then the fewest domains, then one cluster."""
    cap = work.cap
    clusters: dict[str, list[int]] = {}
    for c in classes:
        clusters.setdefault(cap.class_keys[c][1], []).append(c)
    key = job.spec.topology_key
    if key and key != work.s.topology_key:
        spot = _fill_by_label(work, job, clusters, key)
        if spot is not None:
            return spot
    # Best fit among groups too: the emptiest-but-sufficient rack keeps big ones whole.
    in_domain: list[tuple[int, str, str, list[int]]] = []
    kept_sorted: list[Iterable[tuple[int, str, str, list[int]]]] = []  # one cluster's, from the index
    dom_free = cap.dom_free
    for cluster, cls in clusters.items():
        if len(cls) == 1:
            kept_sorted.append(_with_cluster(cap.domains_with(cls[0], n), cluster, cls))
            continue
        for domain in set().union(*(cap.class_domains[c] for c in cls)):
            free = sum(dom_free.get((c, domain), 0) for c in cls)
            if free >= n:
                in_domain.append((free, cluster, domain, cls))
    for _, _, domain, cls in heapq.merge(sorted(in_domain), *kept_sorted):
        spot = cap.fill(cls, per, replicas, domain)
        if spot is not None:
            return spot
    for free, _, cls in sorted((cap.free_in(cls), cluster, cls) for cluster, cls in clusters.items()):
        if free >= n:
            spot = cap.fill(cls, per, replicas)
            if spot is not None:
                return spot
    return None


def _with_cluster(
    domains: list[tuple[int, str]], cluster: str, cls: list[int]
) -> Iterator[tuple[int, str, str, list[int]]]:
    for free, domain in domains:
        yield free, cluster, domain, cls


def _fill_by_label(work: Work, job: Job, clusters: dict[str, list[int]], key: str) -> Spot | None:
    """A gang naming a topology label the index does not bucket by: group free nodes by that
    label's value (a scan of the free nodes, for such gangs only), best-fit domain first."""
    cap, nodes = work.cap, work.s.node_by_id
    per, replicas = job.spec.gpus_per_replica, job.spec.replicas
    for _, cls in sorted(clusters.items()):
        groups: dict[str, tuple[int, set[int]]] = {}
        for c in cls:
            for k in range(per, cap.max_gpus + 1):
                for nid in cap.buckets[c][k]:
                    value = nodes[nid].labels.get(key)
                    if value is not None:
                        free, members = groups.get(value, (0, set()))
                        members.add(nid)
                        groups[value] = (free + (k // per) * per, members)
        for free, _, members in sorted((f, v, m) for v, (f, m) in groups.items()):
            if free >= job.gpus:
                spot = cap.fill(cls, per, replicas, only=members)
                if spot is not None:
                    return spot
        # No one domain has room: the fewest domains that do (fewest leaf switches crossed).
        spread = fewest_domains(groups, job.spec.total_gpus)
        if spread is not None and (spot := cap.fill(cls, per, replicas, only=spread)) is not None:
            return spot
    return None


def fits(work: Work, job: Job, usage: Usage) -> bool:
    """Quota and placement both allow the job (with `usage`), without keeping anything."""
    if quota.block(work, job, usage) is not None:
        return False
    mark = work.cap.mark()
    spot = place(work, job)
    work.cap.rollback(mark)
    return spot is not None
