"""bench/fairness.py's `inversion_p`: is a class-mean inversion more than its classes' sizes explain?"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from events import PriorityClass

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.fairness import by_size, inversion_p

HIGH, NORMAL = PriorityClass.HIGH, PriorityClass.NORMAL


def _outcome(*jobs: tuple[PriorityClass, int, float | None]) -> Any:
    """An outcome of (class, GPUs, wait in hours or None for never started) jobs: what inversion_p reads."""
    return SimpleNamespace(
        jobs={
            f"j{i}": SimpleNamespace(
                t=SimpleNamespace(priority=c, gpus=g, submit_s=100.0),
                first_start=None if w is None else 100.0 + w * 3600,
            )
            for i, (c, g, w) in enumerate(jobs)
        }
    )


def test_an_urgent_class_that_waits_longer_at_every_size_is_not_noise() -> None:
    jobs = [(HIGH, g, 10.0 + i % 3) for i in range(20) for g in (1, 8)]
    jobs += [(NORMAL, g, 1.0 + i % 3) for i in range(20) for g in (1, 8)]
    assert inversion_p(_outcome(*jobs), "high", "normal") < 0.01


def test_a_gap_made_by_the_classes_mix_of_sizes_is_named_so() -> None:
    # normal waits longer only because its jobs are big; at one GPU it waits less than low does
    jobs = [(NORMAL, 8, 50.0)] * 5 + [(NORMAL, 1, 0.5)] * 5 + [(PriorityClass.LOW, 1, 2.0 + i % 2) for i in range(50)]
    assert inversion_p(_outcome(*jobs), "normal", "low") == 1.0


def test_a_small_class_drawn_from_the_same_waits_is_within_noise() -> None:
    waits = [float(w) for w in range(40)]
    jobs = [(HIGH, 1, w) for w in waits] + [(NORMAL, 1, w) for w in (1.0, 30.0, 5.0)] + [(HIGH, 1, None)]
    p = inversion_p(_outcome(*jobs), "high", "normal")
    assert 0.05 < p < 0.5  # high's mean 19.5 h against normal's 12 h: three jobs tell little
    assert inversion_p(_outcome(*jobs), "high", "normal") == p  # seeded


def test_mean_waits_per_job_size() -> None:
    out = by_size(_outcome((HIGH, 1, 1.0), (HIGH, 1, 3.0), (HIGH, 8, 40.0), (NORMAL, 8, None)))
    assert out == {"high": {"1": {"jobs": 2, "mean_h": 2.0}, "8": {"jobs": 1, "mean_h": 40.0}}}
