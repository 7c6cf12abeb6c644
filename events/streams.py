"""The JetStream streams of the design: what each holds and for how long."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

HOUR = 3600.0
DAY = 24 * HOUR


class Retention(StrEnum):
    LIMITS = "limits"
    INTEREST = "interest"
    WORK_QUEUE = "workqueue"


class Storage(StrEnum):
    FILE = "file"
    MEMORY = "memory"


@dataclass(frozen=True)
class StreamSpec:
    """One stream. `max_age_s` None keeps messages forever (domain history is the source of truth)."""

    name: str
    subjects: tuple[str, ...]
    description: str
    max_age_s: float | None
    duplicate_window_s: float
    retention: Retention = Retention.LIMITS
    storage: Storage = Storage.FILE
    max_msg_size: int = 1024 * 1024

    def covers(self, subject: str) -> bool:
        return any(_matches(pattern, subject) for pattern in self.subjects)


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


# Decision streams keep a longer duplicate window so that a service that replays after a crash
# re-emits its decisions with the same ids and JetStream drops them.
TELEMETRY = StreamSpec("TELEMETRY", ("chamber.telemetry.>",), "GPU samples and node inventories from agents", DAY, 120)
FAULTS = StreamSpec("FAULTS", ("chamber.faults.>",), "GPU faults from on-node detectors", 30 * DAY, 600)
FLEET = StreamSpec("FLEET", ("chamber.fleet.>",), "nodes discovered, updated, lost, isolated, restored", None, 600)
JOBS = StreamSpec("JOBS", ("chamber.jobs.>",), "job lifecycle and scheduling decisions", None, 600)
QUOTA = StreamSpec("QUOTA", ("chamber.quota.>",), "pools, team quotas, fair-share factors, budgets", None, 600)
BILLING = StreamSpec("BILLING", ("chamber.billing.>",), "prices, accrued cost, budgets exceeded", None, 600)
DEAD = StreamSpec("DEAD", ("chamber.dead.>",), "poison messages, with the reason in a header", 30 * DAY, 120)

STREAMS: tuple[StreamSpec, ...] = (TELEMETRY, FAULTS, FLEET, JOBS, QUOTA, BILLING, DEAD)


def stream_for(subject: str) -> StreamSpec | None:
    return next((s for s in STREAMS if s.covers(subject)), None)
