"""The free-GPU index: per node class, nodes bucketed by their number of free GPUs.

Best fit is then "the lowest node id in the smallest bucket that is big enough", found in
O(classes x GPUs-per-node) instead of a scan of the fleet. A node class groups nodes that are
interchangeable for a job's constraints: same pool, cluster and GPU model. A second, finer index
buckets nodes per (class, topology domain) so gangs can look for room within one rack.

Every change can be journaled; `rollback(mark)` undoes changes back to a mark. A scheduling cycle
works on the live index and rolls everything back at its end (KAI's Statement, at cycle scale), so
`schedule()` leaves the state exactly as it found it, without copying 10,000 nodes per cycle.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass

from services.scheduler.core.sortedlist import SortedList

ClassKey = tuple[str, str, str]  # pool, cluster, gpu model
# A journal entry: (node id, GPU indices, taken), or an undo of a change outside the index (GPU shares).
# The indices are a tuple of their own: of atoms only, so the collector stops tracking the entry (a
# full cycle journals one per placement, and they would otherwise be walked by every full collection).
Entry = tuple[int, tuple[int, ...], bool] | Callable[[], None]


@dataclass
class Slot:
    """One node as the index sees it: which GPUs are free now, and its class."""

    cls: int
    domain: str = ""  # topology domain (e.g. the rack), "" if the node has none
    # Sorted indices of healthy, unallocated GPUs: a tuple, replaced on every change (a tuple of ints is
    # soon untracked by the collector: a full cycle replaces one per placement, and lists would be
    # walked by every full collection until the cycle ends).
    free: tuple[int, ...] = ()
    total: int = 0  # healthy GPUs (free or allocated) while the node is in service
    usable: bool = True

    def __getstate__(self) -> dict[str, object]:
        # pickled as a list, as before the tuple: a snapshot reads the same to this release and the last
        return {**self.__dict__, "free": list(self.free)}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.free = tuple(self.free)


class Capacity:
    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.class_keys: list[ClassKey] = []
        self.class_ids: dict[ClassKey, int] = {}
        self.buckets: list[list[SortedList[int]]] = []  # [class][free count] -> node ids
        self.class_free: list[int] = []
        self.class_total: list[int] = []
        self.dom_buckets: dict[tuple[int, str], list[list[int]]] = {}
        self.dom_free: dict[tuple[int, str], int] = {}
        self.class_domains: list[set[str]] = []
        self.max_gpus = 0  # GPUs of the largest node: buckets go 1..max_gpus
        self._journal: list[Entry] | None = None
        # Derived, per class: (free GPUs, domain) of the domains with any free, sorted, so a gang
        # finds the emptiest-but-sufficient domains without a scan of them all. Not pickled: rebuilt.
        self.dom_order: list[list[tuple[int, str]]] = []
        # Derived, per node id: its free GPUs while in service (else -1) and its class, as columns, so
        # a victim search finds the nodes that could get room without reading them one by one.
        # Rebuilt on load, not pickled.
        self.free_col, self.cls_col = _column(0), _column(0)

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in _DERIVED}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        # snapshots from before the buckets were chunked hold plain sorted lists
        self.buckets = [[b if isinstance(b, SortedList) else SortedList(b) for b in c] for c in self.buckets]
        self.dom_order = [[] for _ in self.class_keys]
        for (cls, domain), free in sorted(self.dom_free.items()):
            if free > 0:
                self.dom_order[cls].append((free, domain))
        for order in self.dom_order:
            order.sort()
        self.free_col, self.cls_col = _column(len(self.slots)), _column(len(self.slots))
        for nid, slot in enumerate(self.slots):
            self.cls_col[nid] = slot.cls
            self.free_col[nid] = len(slot.free) if slot.usable else -1

    # -- classes and slots -------------------------------------------------------------------
    def class_id(self, key: ClassKey) -> int:
        cid = self.class_ids.get(key)
        if cid is None:
            cid = self.class_ids[key] = len(self.class_keys)
            self.class_keys.append(key)
            self.buckets.append([SortedList() for _ in range(self.max_gpus + 1)])
            self.class_free.append(0)
            self.class_total.append(0)
            self.class_domains.append(set())
            self.dom_order.append([])
        return cid

    def _grow(self, gpus: int) -> None:
        if gpus > self.max_gpus:
            for c in self.buckets:
                c.extend(SortedList() for _ in range(gpus - self.max_gpus))
            for b in self.dom_buckets.values():
                b.extend([] for _ in range(gpus - self.max_gpus))
            self.max_gpus = gpus

    def set_slot(self, nid: int, cls: int, free: list[int], total: int, usable: bool, domain: str = "") -> None:
        """(Re)define node `nid` from scratch (discovery, update, isolation, pool change)."""
        self._grow(max(total, len(free)))
        while len(self.slots) <= nid:
            self.slots.append(Slot(cls=cls, usable=False))
        old = self.slots[nid]
        self._unbucket(nid)
        if old.usable:
            self.class_total[old.cls] -= old.total
        slot = Slot(cls=cls, domain=domain, free=tuple(sorted(free)), total=total, usable=usable)
        if domain and (cls, domain) not in self.dom_buckets:
            self.dom_buckets[(cls, domain)] = [[] for _ in range(self.max_gpus + 1)]
            self.dom_free[(cls, domain)] = 0
            self.class_domains[cls].add(domain)
        self.slots[nid] = slot
        if len(self.free_col) < len(self.slots):
            more = len(self.slots) - len(self.free_col)
            self.free_col.extend(_column(more))
            self.cls_col.extend(_column(more))
        self.cls_col[nid] = cls
        if usable:
            self.class_total[cls] += total
        self._bucket(nid)

    def _unbucket(self, nid: int) -> None:
        slot = self.slots[nid]
        k = len(slot.free)
        if slot.usable and k:
            self.buckets[slot.cls][k].remove(nid)
            self.class_free[slot.cls] -= k
            if slot.domain:
                bucket = self.dom_buckets[(slot.cls, slot.domain)][k]
                del bucket[bisect_left(bucket, nid)]
                self._domain_free(slot.cls, slot.domain, -k)

    def _bucket(self, nid: int) -> None:
        slot = self.slots[nid]
        k = len(slot.free)
        self.free_col[nid] = k if slot.usable else -1
        if slot.usable and k:
            self.buckets[slot.cls][k].add(nid)
            self.class_free[slot.cls] += k
            if slot.domain:
                insort(self.dom_buckets[(slot.cls, slot.domain)][k], nid)
                self._domain_free(slot.cls, slot.domain, k)

    def _domain_free(self, cls: int, domain: str, change: int) -> None:
        old = self.dom_free[(cls, domain)]
        new = self.dom_free[(cls, domain)] = old + change
        order = self.dom_order[cls]
        if old > 0:
            del order[bisect_left(order, (old, domain))]
        if new > 0:
            insort(order, (new, domain))

    # -- allocation (journaled) --------------------------------------------------------------
    def take(self, nid: int, n: int) -> list[int]:
        """Allocate the `n` lowest free GPU indices of a node."""
        slot = self.slots[nid]
        self._unbucket(nid)
        free = slot.free
        taken, slot.free = list(free[:n]), free[n:]
        self._bucket(nid)
        if self._journal is not None:
            self._journal.append((nid, tuple(taken), True))
        return taken

    def take_exact(self, nid: int, indices: list[int]) -> None:
        slot = self.slots[nid]
        self._unbucket(nid)
        gone = set(indices)
        slot.free = tuple([i for i in slot.free if i not in gone])
        self._bucket(nid)
        if self._journal is not None:
            self._journal.append((nid, tuple(indices), True))

    def give(self, nid: int, indices: list[int]) -> None:
        """Free GPUs of a node (the caller passes only healthy ones)."""
        if not indices:
            return
        slot = self.slots[nid]
        self._unbucket(nid)
        slot.free = tuple(sorted(set(slot.free).union(indices)))
        self._bucket(nid)
        if self._journal is not None:
            self._journal.append((nid, tuple(indices), False))

    def undo(self, action: Callable[[], None]) -> None:
        """Journal the undo of a change made beside the index (a GPU share taken or given, shares.py),
        so `rollback` undoes it in order with the index's own changes. Nothing to keep outside a journal."""
        if self._journal is not None:
            self._journal.append(action)

    def begin(self) -> int:
        if self._journal is None:
            self._journal = []
        return len(self._journal)

    def mark(self) -> int:
        assert self._journal is not None, "begin() first"
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        journal = self._journal
        assert journal is not None
        while len(journal) > mark:
            entry = journal.pop()
            if not isinstance(entry, tuple):
                entry()
                continue
            nid, indices, taken = entry
            slot = self.slots[nid]
            self._unbucket(nid)
            if taken:
                slot.free = tuple(sorted([*slot.free, *indices]))
            else:
                gone = set(indices)
                slot.free = tuple([i for i in slot.free if i not in gone])
            self._bucket(nid)

    def end(self) -> None:
        """Roll back everything since `begin()` and stop journaling."""
        self.rollback(0)
        self._journal = None

    # -- queries -----------------------------------------------------------------------------
    def free_in(self, classes: list[int]) -> int:
        return sum(self.class_free[c] for c in classes)

    def max_free(self, classes: list[int]) -> int:
        best = 0
        for c in classes:
            b = self.buckets[c]
            for k in range(len(b) - 1, best, -1):
                if b[k]:
                    best = k
                    break
        return best

    def replicas_fit(self, classes: list[int], per_replica: int) -> int:
        """How many replicas of `per_replica` GPUs the free GPUs could hold, node by node."""
        total = 0
        for c in classes:
            b = self.buckets[c]
            for k in range(per_replica, len(b)):
                if b[k]:
                    total += len(b[k]) * (k // per_replica)
        return total

    def domains_with(self, cls: int, n: int) -> list[tuple[int, str]]:
        """(free GPUs, domain) of the class's domains with at least `n` free, emptiest first (a copy:
        the caller may take GPUs while it reads)."""
        order = self.dom_order[cls]
        return order[bisect_left(order, (n, "")) :]

    def best_fit(self, classes: list[int], n: int) -> int | None:
        """The node with the fewest free GPUs that still has `n`; ties to the lowest node id."""
        for k in range(n, self.max_gpus + 1):
            best: int | None = None
            for c in classes:
                b = self.buckets[c][k]
                if b and (best is None or b.first() < best):
                    best = b.first()
            if best is not None:
                return best
        return None

    def fill(
        self,
        classes: list[int],
        per_replica: int,
        replicas: int,
        domain: str | None = None,
        only: set[int] | None = None,
    ) -> list[tuple[int, list[int]]] | None:
        """Place a gang replica by replica on best-fit nodes (of one topology domain if given);
        all or nothing (rolled back on failure)."""
        placed: list[tuple[int, list[int]]] = []
        need = replicas
        own_journal = self._journal is None
        mark = self.begin()
        for k in range(per_replica, self.max_gpus + 1):
            # A node taken from bucket k drops below k, so each node is visited once.
            if only is not None:
                nodes = sorted(nid for c in classes for nid in self.buckets[c][k] if nid in only)
            elif domain is None:
                nodes = sorted(nid for c in classes for nid in self.buckets[c][k])
            else:
                nodes = sorted(
                    nid for c in classes if (c, domain) in self.dom_buckets for nid in self.dom_buckets[(c, domain)][k]
                )
            for nid in nodes:
                fit = min(k // per_replica, need)
                placed.append((nid, self.take(nid, fit * per_replica)))
                need -= fit
                if need == 0:
                    if own_journal:
                        self._journal = None
                    return placed
        self.rollback(mark)
        if own_journal:
            self._journal = None
        return None

    def digest(self) -> tuple[object, ...]:
        """Everything observable, for tests that check a computation left the index untouched."""
        return (
            tuple((s.cls, tuple(s.free), s.total, s.usable) for s in self.slots),
            tuple(tuple(tuple(b) for b in c) for c in self.buckets),
            tuple(self.class_free),
            tuple(self.class_total),
            tuple(sorted((k, tuple(tuple(b) for b in v)) for k, v in self.dom_buckets.items())),
        )


_DERIVED = ("dom_order", "free_col", "cls_col")  # rebuilt on load, not pickled


def _column(size: int) -> array[int]:
    """A per-node column of `size` rows, all -1 (no node, or one out of service): an `array`, cheap to
    set one row of on every change, read column-wise as numpy (`numpy.frombuffer`, no copy)."""
    return array("q", [-1]) * size
