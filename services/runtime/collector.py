"""The cyclic garbage collector around a decider's synchronous sections (deciding, folding a batch).

Deciding or folding a large batch allocates hundreds of thousands of container objects (decisions,
events, placements, the state's new records) that nearly all live on. Left running, the collector
walks them again and again in the middle of the section: every young collection, and full
collections that (after the state was frozen on catching up) come each time the survivors grow by a
quarter: at 50,000 nodes about 0.7 s of a 4.9 s first cycle (bench/scheduler.py), for nothing: the scheduler core makes
no reference cycles (`tests/unit/test_collector.py` checks a state and a cycle's output are freed
by reference counting alone).

`paused_collector()` turns the collector off for one synchronous section (never across an await:
other tasks' garbage would pile up meanwhile) and turns it back on after. When the section grew the
tracked objects by more than `FREEZE_AFTER`, it then collects once (one walk over the new objects,
freeing any cycle the section did make) and freezes what is left: it lives on (the state), and a
frozen object is still freed by reference counting when it is dropped. Only a reference cycle that
was alive at the freeze and becomes garbage later is never freed; the core makes none, and the
host's own long-lived objects (tasks, consumers) are a bounded few per freeze, which happens only
after such large sections (catching up, a first cycle, a large batch), not after every small one.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Net new tracked objects in one section above which it is collected and frozen after. Chosen on the
# scheduler bench at 10,000 nodes / 20,000 jobs (bench/scheduler.py): its first cycle's decide makes
# 153,115, its 200 incremental cycles at most 1,081 each; well between, so that a large section is
# frozen and a small one is left to the ordinary young collections. Held out, at 50,000 nodes /
# 100,000 jobs: 728,244 and at most 646.
FREEZE_AFTER = 20_000


@contextmanager
def paused_collector(freeze_after: int = FREEZE_AFTER) -> Iterator[None]:
    """Run the block with the cyclic collector off; after it, collect and freeze a large growth."""
    if not gc.isenabled():  # turned off by an enclosing section (or by the caller): leave it so
        yield
        return
    gc.disable()
    try:
        yield
    except BaseException:
        gc.enable()  # not frozen: the exception in flight (and its frames) must stay collectable
        raise
    gc.enable()
    if gc.get_count()[0] > freeze_after:
        gc.collect()
        gc.freeze()
