"""One PNG: allocated-GPU utilization and queue length over time, one line per policy."""

from __future__ import annotations

from pathlib import Path

from services.tracesim.engine import Outcome


def plot(outcomes: dict[str, Outcome], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for name, outcome in outcomes.items():
        days = [(s.t - outcome.first_submit) / 86400 for s in outcome.samples]
        top.plot(days, [100 * s.allocated / outcome.fleet.gpus for s in outcome.samples], label=name, linewidth=0.9)
        bottom.plot(days, [s.queued for s in outcome.samples], label=name, linewidth=0.9)
    top.set_ylabel("GPUs allocated (%)")
    top.set_ylim(0, 105)
    top.legend(loc="lower right")
    top.grid(alpha=0.3)
    bottom.set_ylabel("jobs waiting")
    bottom.set_xlabel("days since first submit")
    bottom.set_yscale("symlog")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
