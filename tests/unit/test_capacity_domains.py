"""The capacity index's sorted free GPUs per topology domain (what gangs read to find the
emptiest-but-sufficient rack) agree with a scan of the domains after takes, gives, rollbacks and a
pickle round trip (the sorted lists are not pickled: they are rebuilt on load)."""

from __future__ import annotations

import pickle
import random

from services.scheduler.core.capacity import Capacity


def scanned(cap: Capacity, cls: int, n: int) -> list[tuple[int, str]]:
    return sorted((f, d) for d in cap.class_domains[cls] if (f := cap.dom_free[(cls, d)]) >= n)


def a_fleet(rng: random.Random) -> Capacity:
    cap = Capacity()
    classes = [cap.class_id(("default", "c1", "H100")), cap.class_id(("default", "c2", "H100"))]
    for nid in range(60):
        gpus = rng.choice([4, 8])
        cap.set_slot(nid, rng.choice(classes), list(range(gpus)), gpus, True, f"r{rng.randrange(6)}")
    return cap


def test_the_sorted_domains_follow_every_change() -> None:
    rng = random.Random(3)
    cap = a_fleet(rng)
    for _ in range(8):
        for nid in rng.sample(range(60), 5):  # redefined nodes (a pool or rack change, an isolation)
            total = cap.slots[nid].total
            cap.set_slot(nid, cap.slots[nid].cls, list(range(total)), total, rng.random() < 0.8, f"r{rng.randrange(8)}")
        cap.begin()  # a cycle: journaled takes and gives, partly rolled back, then all
        for _ in range(50):
            nid = rng.randrange(60)
            slot = cap.slots[nid]
            if rng.random() < 0.6 and slot.free:
                cap.take(nid, rng.randint(1, len(slot.free)))
            elif rng.random() < 0.2:
                cap.rollback(rng.randrange(cap.mark() + 1))
            elif missing := [i for i in range(slot.total) if i not in slot.free]:
                cap.give(nid, rng.sample(missing, rng.randint(1, len(missing))))
            assert all(cap.domains_with(cls, n) == scanned(cap, cls, n) for cls in (0, 1) for n in (1, 5, 16))
        cap.end()
        assert all(cap.domains_with(cls, n) == scanned(cap, cls, n) for cls in (0, 1) for n in (1, 5, 16))
    loaded = pickle.loads(pickle.dumps(cap))
    assert "dom_order" not in cap.__getstate__()
    assert loaded.dom_order == cap.dom_order and loaded.digest() == cap.digest()
