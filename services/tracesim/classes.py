"""Give a trace's jobs priority classes and preemptibility, seeded: `--classes` on `chamber sim`.

A mix is `class=weight,...` (weights are normalised, so percentages or fractions both work), e.g.
the default `critical=0.1,high=58,normal=1.5,low=40.5` (the proportions of issue 19's production
trace); the classes listed in `preemptible` (default `low`) are preemptible, the others not.

Each job draws its class from its own seeded generator (`seed` and its job id), so a job keeps its
class whatever subset of the trace is replayed (`--jobs`, `--team`), and the same seed gives the
same classes on any machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from events import PriorityClass
from services.tracesim.trace import TraceError, TraceJob

DEFAULT_MIX = "critical=0.1,high=58,normal=1.5,low=40.5"
DEFAULT_PREEMPTIBLE = "low"


@dataclass(frozen=True)
class ClassMix:
    weights: tuple[tuple[PriorityClass, float], ...]  # most urgent first, summing to 1
    preemptible: frozenset[PriorityClass]
    seed: int = 0

    def describe(self) -> str:
        mix = ",".join(f"{c.value}={w:.4g}" for c, w in self.weights)
        pre = ",".join(c.value for c in PriorityClass if c in self.preemptible) or "none"
        return f"{mix} (preemptible: {pre}; seed {self.seed})"


def _class(name: str, what: str) -> PriorityClass:
    try:
        return PriorityClass(name.strip().lower())
    except ValueError:
        allowed = ", ".join(p.value for p in PriorityClass)
        raise TraceError(f"{what}: {name.strip()!r} is not a priority class; use {allowed}") from None


def parse_mix(text: str, preemptible: str = DEFAULT_PREEMPTIBLE, seed: int = 0) -> ClassMix:
    """`critical=0.1,high=58,...` and `low` (or `none`) as a ClassMix; a clear TraceError otherwise."""
    weights: dict[PriorityClass, float] = {}
    for part in (p for p in text.split(",") if p.strip()):
        name, sep, raw = part.partition("=")
        if not sep:
            raise TraceError(f"--classes: {part.strip()!r} needs a weight, e.g. high=58")
        cls = _class(name, "--classes")
        if cls in weights:
            raise TraceError(f"--classes: {cls.value} appears twice")
        try:
            w = float(raw)
        except ValueError:
            raise TraceError(f"--classes: the weight of {cls.value} is {raw.strip()!r}, not a number") from None
        if not 0 <= w < float("inf"):
            raise TraceError(f"--classes: the weight of {cls.value} must be a finite number, 0 or more")
        weights[cls] = w
    total = sum(weights.values())
    if total <= 0:
        raise TraceError("--classes: give at least one class a weight above 0, e.g. high=58,low=42")
    pre = (
        frozenset()
        if preemptible.strip().lower() == "none"
        else frozenset(_class(n, "--preemptible-classes") for n in preemptible.split(",") if n.strip())
    )
    ordered = tuple((c, weights[c] / total) for c in PriorityClass if c in weights)
    return ClassMix(ordered, pre, seed)


def assign(jobs: list[TraceJob], mix: ClassMix) -> list[TraceJob]:
    """The jobs with a class drawn from the mix and the preemptibility of that class."""
    out = []
    for job in jobs:
        draw = random.Random(f"{mix.seed}:{job.id}").random()
        cls = mix.weights[-1][0]
        acc = 0.0
        for c, w in mix.weights:
            acc += w
            if draw < acc:
                cls = c
                break
        out.append(replace(job, priority=cls, preemptible=cls in mix.preemptible))
    return out
