"""Priority and fairness across traces: the DEFAULT chamber policy (no per-trace flags) against fifo,
run through the simulator's own `compare` (what `chamber sim --compare fifo,chamber` runs), on
several public traces, each at two fleet sizes that leave it under pressure, with equal-share quotas.

    .venv/bin/python bench/fairness.py [--traces itp-analogue,itp-cluster02,...,openb]
        [--openb PATH] [--seeds N] [--teams N] [--json-only] [--tuning JSON] [--no-fair-share]
    .venv/bin/python bench/fairness.py --csv YOURS.csv --gpus 64,48   # a trace of your own

Traces (docs/fairness.md has the class mappings and why these fleet sizes):
  tuning   itp-analogue   issue 19's 6,200-job 4-team slice of the bundled ITP trace; random classes
  held out itp-cluster02  one ITP cluster (3,975 jobs); random classes, 4 random teams
  held out itp-cluster03  another ITP cluster (914 jobs, mostly 8 GPUs); random classes, 4 random teams
  fresh    itp-cluster01, itp-cluster06, itp-cluster08  three more ITP clusters (847, 1,093 and 12,002
                          jobs), first run with the policy fixed: no choice looked at them as clusters
                          (the analogue samples some of their jobs, mixed with the others')
  held out openb          Alibaba's 2023 GPU pod trace (6,203 GPU pods): its real QoS classes, 4 random
                          teams; not in the repository (licence), read from --openb
"Random" draws are seeded: seeds 0..N-1 (`--seeds`, default 3; openb 2, its 32-GPU run is slow).
`--teams N` draws the random teams as N instead of 4 (each an equal share of the fleet).
The chamber policy plays the quota service's fair-share factor, as deployed; `--no-fair-share`
holds every team's factor at 1 (`chamber sim --no-fair-share`).
  yours    --csv PATH     any trace in `chamber sim`'s CSV columns, with its own `priority` and
                          `preemptible` columns and teams; run once per fleet size of --gpus

Per run it prints, per class, mean / p50 / p99 wait (hours) for fifo and chamber and their ratios
(chamber / fifo), chamber's mean wait per job size (`chamber_by_gpus`), both utilizations, and the
targets: every class's p99 <= fifo's; each class's mean wait <= the mean of every lower class;
both again on the time queued in all (`queued_*`: the first wait plus every wait after a preemption,
which the first wait alone does not see); utilization >= fifo's - 1 point; and no more jobs left
unstarted than under fifo (a job that never starts has no wait to count); per split, the runs that
met every target (`met_by_split`). A table on stderr, one JSON object on stdout.

Each mean inversion also gets `inversion_p`: the share of random relabelings of its two classes'
jobs (each label kept among jobs of the same GPU count) whose gap is at least the one observed. It
explains a miss, it does not excuse one: near 0, the more urgent class waits longer than treating the
classes alike would give; 0.1 and up, within the noise of the classes' sizes; 1.0, within every job
size the more urgent class waits less, and the gap is the classes' mix of sizes. And `matched`: the
less urgent class's jobs set against the more urgent class's jobs of the same GPU count submitted
within 6 hours of each (`jobs` of the less urgent class found such company; their mean wait and the
company's): a class of a few jobs that arrived in calm hours can have a lower mean than a busy class
that the policy still serves first, at the same size and time. And `rests_on`: the fewest (at most
5) of the more urgent class's longest waits without which the means are in order, with their sizes.
Each class also gets `against_fifo`: job by job, who waited longer than under fifo, and whose waits
make each policy's p99 (an explanation too).

How far a run is from the p99 target: `worst_p99_ratio`, the largest chamber / fifo p99 over its
classes and both measures (1.0 or less: met). `met_within` counts, per split, the runs that meet
every other target as they stand and have every class's p99 within each of `P99_TOLERANCES` of
fifo's (1.05: at most 5 % above). Not a target: it says how near a miss is.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.tracesim.analogue import CLASSES, analogue, inverted, p99_le_fifo  # noqa: E402
from services.tracesim.classes import DEFAULT_MIX, assign, parse_mix  # noqa: E402
from services.tracesim.engine import FleetSpec, Outcome  # noqa: E402
from services.tracesim.openb import load_openb  # noqa: E402
from services.tracesim.quotas import equal_shares  # noqa: E402
from services.tracesim.run import add_fair_share_argument, compare, make_policy  # noqa: E402
from services.tracesim.trace import TraceError, TraceJob, load  # noqa: E402

ITP = ROOT / "data" / "traces" / "itp" / "jobs.csv"
OPENB = ROOT / "data" / "traces" / "alibaba-openb" / "openb_pod_list_default.csv"
HOUR = 3600.0
RANDOM_TEAMS = 4  # teams a trace without teams is drawn into (--teams)


@cache
def _itp_jobs() -> tuple[TraceJob, ...]:
    """The bundled ITP trace, read once per process (every ITP build and seed starts from it)."""
    return tuple(load(ITP).jobs)


def _itp_cluster(cluster: str) -> Callable[[int, Path, int], list[TraceJob]]:
    def build(seed: int, _: Path, teams: int) -> list[TraceJob]:
        jobs = [j for j in _itp_jobs() if j.team == cluster]
        rng = random.Random(f"teams:{seed}")
        start = jobs[0].submit_s
        drawn = [replace(j, team=f"team-{rng.randrange(teams)}", submit_s=j.submit_s - start) for j in jobs]
        return assign(drawn, parse_mix(DEFAULT_MIX, seed=seed))

    return build


def _analogue(seed: int, _: Path, _teams: int) -> list[TraceJob]:
    # its four skewed teams are part of what it stands in for: no random draw to change
    return assign(analogue(list(_itp_jobs()), seed=seed), parse_mix(DEFAULT_MIX, seed=seed))


def _openb(seed: int, path: Path, teams: int) -> list[TraceJob]:
    # the downloaded trace's csv/ folder names its pod list; the folder will do
    return load_openb(path / OPENB.name if path.is_dir() else path, seed=seed, teams=teams)


@dataclass(frozen=True)
class Spec:
    # "tuning" (the policy's constants were chosen looking at it), "held out" (no constant was chosen
    # on it; some mechanisms were designed looking at it) or "fresh" (first run with the policy fixed)
    split: str
    build: Callable[[int, Path, int], list[TraceJob]]  # (seed, the openb trace, teams for a random draw)
    gpus: tuple[int, ...]
    classes: str  # how jobs got their classes
    seeds: int | None = None  # default number of seeds, if not --seeds


RANDOM_MIX = f"random, seeded: {DEFAULT_MIX}; low preemptible"  # how the ITP traces get their classes


def _itp(split: str, cluster: str, gpus: tuple[int, ...]) -> Spec:
    """One ITP cluster alone: the random class mix, teams drawn at random."""
    return Spec(split, _itp_cluster(cluster), gpus, RANDOM_MIX)


TRACES: dict[str, Spec] = {
    "itp-analogue": Spec("tuning", _analogue, (40, 32), RANDOM_MIX),
    "itp-cluster02": _itp("held out", "cluster02", (80, 64)),
    "itp-cluster03": _itp("held out", "cluster03", (96, 80)),
    # Fleet sizes chosen on fifo's waits alone (hours to hundreds of hours), before any chamber run.
    "itp-cluster01": _itp("fresh", "cluster01", (32, 24)),
    "itp-cluster06": _itp("fresh", "cluster06", (96, 80)),
    "itp-cluster08": _itp("fresh", "cluster08", (72, 64)),
    # The ITP trace's four other clusters with work to queue (cluster10 has 62 jobs), added once the
    # three above had been run, their sizes again chosen on fifo's waits alone before any chamber run.
    "itp-cluster04": _itp("fresh", "cluster04", (560, 520)),
    "itp-cluster05": _itp("fresh", "cluster05", (24, 20)),
    "itp-cluster07": _itp("fresh", "cluster07", (280, 260)),
    "itp-cluster09": _itp("fresh", "cluster09", (30, 28)),
    "openb": Spec(
        "held out",
        _openb,
        (40, 32),
        "the trace's QoS: Guaranteed critical, LS high, Burstable normal, BE low (preemptible); teams seeded",
        seeds=2,
    ),
}


def targets(fifo: dict[str, Any], chamber: dict[str, Any]) -> dict[str, Any]:
    """The targets of one run from the two policies' summaries (`metrics.summarize`): on the wait to
    the first start, and again on the time queued in all (a preempted job waits again until it runs
    again; counted to the first start alone, a preemption would cost its victim no wait at all)."""
    ours = chamber["by_priority"]
    out: dict[str, Any] = {}
    for measure, prefix in (("wait", ""), ("queued", "queued_")):
        out[f"{prefix}p99_le_fifo"] = p99_le_fifo(fifo, chamber, measure)
        out[f"{prefix}mean_inversions"] = [
            f"{hi} {ours[hi][f'{measure}_mean_s'] / HOUR:.2f} h > {lo} {ours[lo][f'{measure}_mean_s'] / HOUR:.2f} h"
            for hi, lo in inverted(chamber, measure)
        ]
    out["utilization_ge_fifo_minus_1pt"] = chamber["utilization"] >= fifo["utilization"] - 0.01
    return out


def _waits(outcome: Outcome) -> Iterator[tuple[str, int, float, float]]:
    """(class, GPUs, wait in seconds, submitted at) of every job that started: what
    `metrics.summarize` counts."""
    for j in outcome.jobs.values():
        if j.first_start is not None:
            yield j.t.priority.value, j.t.gpus, j.first_start - j.t.submit_s, j.t.submit_s


def by_size(outcome: Outcome) -> dict[str, dict[str, dict[str, float]]]:
    """Per class and job size (GPUs), the started jobs and their mean wait in hours: where a class's
    mean comes from (one eight-GPU job that waits for a whole node weighs like many small ones)."""
    waits: dict[str, dict[int, list[float]]] = {}
    for c, gpus, w, _ in _waits(outcome):
        waits.setdefault(c, {}).setdefault(gpus, []).append(w)
    return {
        c: {str(g): {"jobs": len(w), "mean_h": round(sum(w) / len(w) / HOUR, 2)} for g, w in sorted(sizes.items())}
        for c, sizes in waits.items()
    }


def against_fifo(fifo: Outcome, chamber: Outcome) -> dict[str, dict[str, Any]]:
    """Per class, job by job against fifo (jobs that started under both): the share that waited
    longer under chamber, to the first start and in all; of the jobs at or past fifo's p99 wait for
    the class (the jobs that make fifo's p99), the share that waited longer and their mean waits;
    and of the jobs at or past chamber's p99 (to the first start), their mean waits under both.
    Not a target, an explanation: where fifo's head-of-line blocking idles GPUs, few jobs wait
    longer than under it and the tail has room to spare; where it idles none (one-GPU jobs), every
    job under fifo waits only for the work submitted before it, and serving high first makes most
    low jobs wait longer, so chamber's low tail can be jobs that fifo served sooner."""
    slack = 60.0  # a minute: the same start, give or take a scheduling cycle
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for jid, f in fifo.jobs.items():
        o = chamber.jobs.get(jid)
        if f.first_start is None or o is None or o.first_start is None:
            continue
        rows.setdefault(f.t.priority.value, []).append(
            (f.first_start - f.t.submit_s, o.first_start - o.t.submit_s, o.queued_s)
        )
    out: dict[str, dict[str, Any]] = {}
    for c, r in rows.items():
        a = np.array(r)
        tail = a[a[:, 0] >= np.percentile(a[:, 0], 99)]
        ours = a[a[:, 1] >= np.percentile(a[:, 1], 99)]
        out[c] = {
            "jobs": len(a),
            "waited_longer": round(float((a[:, 1] > a[:, 0] + slack).mean()), 3),
            "queued_longer_in_all": round(float((a[:, 2] > a[:, 0] + slack).mean()), 3),
            "fifo_tail_jobs": len(tail),
            "fifo_tail_waited_longer": round(float((tail[:, 1] > tail[:, 0] + slack).mean()), 3),
            "fifo_tail_mean_h": {
                "fifo": round(float(tail[:, 0].mean()) / HOUR, 1),
                "chamber": round(float(tail[:, 1].mean()) / HOUR, 1),
                "chamber_in_all": round(float(tail[:, 2].mean()) / HOUR, 1),
            },
            "chamber_tail_jobs": len(ours),
            "chamber_tail_mean_h": {
                "fifo": round(float(ours[:, 0].mean()) / HOUR, 1),
                "chamber": round(float(ours[:, 1].mean()) / HOUR, 1),
            },
        }
    return out


def inversion_p(outcome: Outcome, urgent: str, lower: str, rounds: int = 2000) -> float:
    """How often treating the two classes alike gives a gap this large: the share of random
    relabelings of the two classes' started jobs, each label kept among jobs of the same GPU count,
    in which `urgent`'s mean wait exceeds `lower`'s by at least the gap observed. Small: `urgent`
    waits longer than equal treatment explains; large: within the noise of the classes' sizes (a
    class of 8 jobs next to one of 500). Seeded: the same outcome gives the same answer."""
    rng = np.random.default_rng(0)
    strata: dict[int, tuple[list[float], int]] = {}
    n = {urgent: 0, lower: 0}
    waited = {urgent: 0.0, lower: 0.0}
    for c, gpus, w, _ in _waits(outcome):
        if c not in n:
            continue
        n[c] += 1
        waited[c] += w
        waits, k = strata.get(gpus, ([], 0))
        waits.append(w)
        strata[gpus] = (waits, k + (c == urgent))
    if not n[urgent] or not n[lower]:
        return 1.0
    gap = waited[urgent] / n[urgent] - waited[lower] / n[lower]
    total = waited[urgent] + waited[lower]
    urgent_sums = np.zeros(rounds)
    for waits, k in strata.values():
        if k:  # the waits the urgent label lands on, per round: the first k of a random order
            order = np.argsort(rng.random((rounds, len(waits))), axis=1)[:, :k]
            urgent_sums += np.asarray(waits)[order].sum(axis=1)
    gaps = urgent_sums / n[urgent] - (total - urgent_sums) / n[lower]
    return round(float(np.mean(gaps >= gap - 1e-9)), 3)


def rests_on(outcome: Outcome, urgent: str, lower: str, most: int = 5) -> dict[str, Any]:
    """The fewest of `urgent`'s longest waits (at most `most`) without which its mean wait is at most
    `lower`'s: their GPU counts and waits (hours), or `jobs` None if more than `most` would have to
    go. One 64-GPU job that waited 450 h can carry a class of 61 jobs past a class of 1,600."""
    waits: dict[str, list[tuple[float, int]]] = {urgent: [], lower: []}
    for c, gpus, w, _ in _waits(outcome):
        if c in waits:
            waits[c].append((w, gpus))
    mine, theirs = sorted(waits[urgent], reverse=True), waits[lower]
    if not mine or not theirs:
        return {"jobs": None}
    bar = sum(w for w, _ in theirs) / len(theirs)
    total = sum(w for w, _ in mine)
    for k in range(1, min(most, len(mine) - 1) + 1):
        total -= mine[k - 1][0]
        if total / (len(mine) - k) <= bar:
            return {
                "jobs": k,
                "gpus": [g for _, g in mine[:k]],
                "waits_h": [round(w / HOUR, 1) for w, _ in mine[:k]],
            }
    return {"jobs": None}


MATCH_WINDOW_S = 6 * HOUR


def matched_waits(outcome: Outcome, urgent: str, lower: str, window_s: float = MATCH_WINDOW_S) -> dict[str, Any]:
    """`lower`'s started jobs against `urgent`'s of the same GPU count submitted within `window_s`
    of each: how many `lower` jobs had such company, their mean wait, and the mean of their
    company's mean waits (hours). Where the class means are inverted but the company waited less,
    the gap is when and how big the two classes' jobs came, not the order the policy served them."""
    company: dict[int, list[tuple[float, float]]] = {}
    mine: list[tuple[int, float, float]] = []
    for c, gpus, w, at in _waits(outcome):
        if c == urgent:
            company.setdefault(gpus, []).append((at, w))
        elif c == lower:
            mine.append((gpus, at, w))
    for line in company.values():
        line.sort()
    prefix = {g: list(accumulate((w for _, w in line), initial=0.0)) for g, line in company.items()}
    own: list[float] = []
    theirs: list[float] = []
    for gpus, at, w in mine:
        line = company.get(gpus, [])
        a = bisect_left(line, (at - window_s, -math.inf))
        b = bisect_right(line, (at + window_s, math.inf))
        if b > a:
            own.append(w)
            theirs.append((prefix[gpus][b] - prefix[gpus][a]) / (b - a))
    if not own:
        return {"jobs": 0, lower + "_h": None, urgent + "_h": None}
    return {
        "jobs": len(own),
        lower + "_h": round(sum(own) / len(own) / HOUR, 2),
        urgent + "_h": round(sum(theirs) / len(theirs) / HOUR, 2),
    }


P99_TOLERANCES = (1.0, 1.02, 1.05, 1.1, 1.25, 1.5, 2.0)  # `met_within`'s: chamber's p99 at most this x fifo's


def worst_p99_ratio(fifo: dict[str, Any], chamber: dict[str, Any]) -> float | None:
    """The largest chamber / fifo p99 over the classes, to the first start and in all, from the two
    policies' summaries (None if a class waited under chamber where fifo's p99 was 0: no ratio says
    how far that is). Rounded up, so a run over fifo's p99 by a hair never reads as 1.0."""
    worst = 0.0
    for c, ours in chamber["by_priority"].items():
        theirs = fifo["by_priority"].get(c)
        for key in ("wait_p99_s", "queued_p99_s"):
            f, o = (theirs or {}).get(key, 0.0), ours[key]
            if f > 0:
                worst = max(worst, o / f)
            elif o > 0:
                return None
    return math.ceil(worst * 1000) / 1000


def met_but_p99(t: dict[str, Any]) -> bool:
    """Every target but the p99s met: class means in order (both measures), utilization, unstarted."""
    ordered = not t["mean_inversions"] and not t["queued_mean_inversions"]
    return ordered and t["utilization_ge_fifo_minus_1pt"] and t.get("unfinished_le_fifo", True)


def met_within(out: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per split, for each of `P99_TOLERANCES`: the runs meeting every other target whose worst p99
    ratio to fifo is within it (the 1.0 column is `met_by_split`'s count)."""
    counts: dict[str, dict[str, int]] = {}
    for name, runs in out["runs"].items():
        row = counts.setdefault(out["traces"][name]["split"], {f"{t:g}": 0 for t in P99_TOLERANCES})
        for r in runs.values():
            worst = r["worst_p99_ratio"]
            for t in P99_TOLERANCES:
                row[f"{t:g}"] += worst is not None and worst <= t and met_but_p99(r["targets"])
    return counts


def met(t: dict[str, Any]) -> bool:
    """Every target: each class's p99 at most fifo's on both measures, and the rest (`met_but_p99`)."""
    return all(t["p99_le_fifo"].values()) and all(t["queued_p99_le_fifo"].values()) and met_but_p99(t)


def run_one(
    jobs: list[TraceJob], gpus: int, tuning: dict[str, Any] | None = None, *, fair_share: bool = True
) -> dict[str, Any]:
    teams = sorted({j.team for j in jobs})
    fleet = FleetSpec(gpus=gpus, gpus_per_node=8)
    fitting = [j for j in jobs if j.gpus <= gpus]
    t0 = time.perf_counter()
    result, outcomes = compare(
        fitting, fleet, equal_shares(teams, gpus), ["fifo", "chamber"], tuning, fair_share=fair_share
    )
    fifo, chamber = result["policies"]["fifo"], result["policies"]["chamber"]
    per_class: dict[str, Any] = {}
    for c in CLASSES:
        if c not in chamber["by_priority"]:
            continue
        row: dict[str, Any] = {"jobs": chamber["by_priority"][c]["jobs"]}
        for stat, key in (
            ("mean", "wait_mean"),
            ("p50", "wait_p50"),
            ("p99", "wait_p99"),
            ("queued_mean", "queued_mean"),
            ("queued_p99", "queued_p99"),
        ):
            f, o = fifo["by_priority"][c][f"{key}_s"], chamber["by_priority"][c][f"{key}_s"]
            row[stat] = {
                "fifo_h": round(f / HOUR, 2),
                "chamber_h": round(o / HOUR, 2),
                "ratio": round(o / f, 3) if f > 0 else (1.0 if o == 0 else None),
            }
        per_class[c] = row
    for c, sizes in by_size(outcomes["chamber"]).items():
        if c in per_class:
            per_class[c]["chamber_by_gpus"] = sizes
    for c, row in against_fifo(outcomes["fifo"], outcomes["chamber"]).items():
        if c in per_class:
            per_class[c]["against_fifo"] = row
    t = targets(fifo, chamber)
    # a job that never starts has no wait: it must not hide a starving class
    t["unfinished_le_fifo"] = chamber["jobs_unfinished"] <= fifo["jobs_unfinished"]
    # each inversion's chance under equal treatment of its two classes (not a target: an explanation)
    t["inversion_p"] = {f"{hi} > {lo}": inversion_p(outcomes["chamber"], hi, lo) for hi, lo in inverted(chamber)}
    t["matched"] = {f"{hi} > {lo}": matched_waits(outcomes["chamber"], hi, lo) for hi, lo in inverted(chamber)}
    t["rests_on"] = {f"{hi} > {lo}": rests_on(outcomes["chamber"], hi, lo) for hi, lo in inverted(chamber)}
    return {
        "gpus": gpus,
        "jobs": len(fitting),
        "utilization": {"fifo": fifo["utilization"], "chamber": chamber["utilization"]},
        # Not a target, an explanation: the whole-run figure counts the drain after the last submit,
        # where one long job that starts late can leave the fleet nearly idle for days.
        "utilization_while_submitting": {
            "fifo": fifo["utilization_while_submitting"],
            "chamber": chamber["utilization_while_submitting"],
        },
        "makespan_h": {"fifo": round(fifo["makespan_s"] / HOUR, 1), "chamber": round(chamber["makespan_s"] / HOUR, 1)},
        "per_class": per_class,
        "preemptions": chamber["preemptions"],
        "lost_gpu_hours": chamber["lost_gpu_hours"],
        "unfinished": {"fifo": fifo["jobs_unfinished"], "chamber": chamber["jobs_unfinished"]},
        "targets": t,
        "all_targets_met": met(t),
        "worst_p99_ratio": worst_p99_ratio(fifo, chamber),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def met_by_split(out: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per split (tuning, held out, fresh, yours): how many runs there were and how many met every
    target; the held-out and fresh counts are the ones that say how the policy generalizes."""
    counts: dict[str, dict[str, int]] = {}
    for name, runs in out["runs"].items():
        row = counts.setdefault(out["traces"][name]["split"], {"runs": 0, "met": 0})
        row["runs"] += len(runs)
        row["met"] += sum(bool(r["all_targets_met"]) for r in runs.values())
    return counts


def table(out: dict[str, Any]) -> str:
    lines = [
        "| trace (split) | GPUs | seed | class | jobs | fifo mean / p50 / p99 (h) | chamber mean / p50 / p99 (h) "
        "| p99 ratio | chamber queued in all: mean / p99 (h) | utilization fifo / chamber | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in out["runs"].items():
        split = out["traces"][name]["split"]
        for key, r in runs.items():
            seed = key.split("/")[0]
            for i, (c, row) in enumerate(r["per_class"].items()):
                f = " / ".join(f"{row[s]['fifo_h']:.1f}" for s in ("mean", "p50", "p99"))
                o = " / ".join(f"{row[s]['chamber_h']:.1f}" for s in ("mean", "p50", "p99"))
                util = f"{r['utilization']['fifo']:.3f} / {r['utilization']['chamber']:.3f}" if i == 0 else ""
                ok = ("met" if r["all_targets_met"] else "MISSED") if i == 0 else ""
                ratio = row["p99"]["ratio"]
                queued = f"{row['queued_mean']['chamber_h']:.1f} / {row['queued_p99']['chamber_h']:.1f}"
                lines.append(
                    f"| {name} ({split}) | {r['gpus']} | {seed} | {c} | {row['jobs']} | {f} | {o} "
                    f"| {'-' if ratio is None else f'{ratio:.2f}'} | {queued} | {util} | {ok} |"
                )
    notes = [
        f"{name} {key}: {inv} (chance under equal treatment {p:.3f}; {_company(pair, m)}{_resting(pair, few)})"
        for name, runs in out["runs"].items()
        for key, r in runs.items()
        for inv, (pair, p), m, few in zip(
            r["targets"]["mean_inversions"],
            r["targets"]["inversion_p"].items(),
            r["targets"]["matched"].values(),
            r["targets"]["rests_on"].values(),
            strict=True,
        )
    ]
    split_counts = ", ".join(f"{split} {c['met']} of {c['runs']}" for split, c in out["met_by_split"].items())
    lines += ["", f"Runs meeting every target: {split_counts}"]
    within = "; ".join(
        f"{split} " + ", ".join(f"{n} within {t}" for t, n in row.items() if t != "1")
        for split, row in out.get("met_within", {}).items()
    )
    if within:
        lines.append(f"Runs meeting every other target, each class's p99 within a ratio of fifo's: {within}")
    if notes:
        lines += ["", "Mean inversions:", *notes]
    # Time queued in all (a preempted job waits again): fifo preempts nothing, so its tail is its wait's
    requeued = [
        f"{name} {key}: "
        + "; ".join(
            [
                f"{c} p99 {r['per_class'][c]['queued_p99']['chamber_h']:.1f} h > fifo's "
                f"{r['per_class'][c]['queued_p99']['fifo_h']:.1f} h"
                for c, ok in r["targets"]["queued_p99_le_fifo"].items()
                if not ok
            ]
            + [f"mean {inv}" for inv in r["targets"]["queued_mean_inversions"]]
        )
        for name, runs in out["runs"].items()
        for key, r in runs.items()
        if not all(r["targets"]["queued_p99_le_fifo"].values()) or r["targets"]["queued_mean_inversions"]
    ]
    if requeued:
        lines += ["", "Misses in time queued in all (the first wait plus every wait after a preemption):", *requeued]
    return "\n".join(lines)


def _resting(pair: str, few: dict[str, Any]) -> str:
    if few["jobs"] is None:
        return ""
    urgent = pair.split(" > ")[0]
    jobs = ", ".join(f"{g} GPUs {w:.0f} h" for g, w in zip(few["gpus"], few["waits_h"], strict=True))
    return f"; in order without {urgent}'s {few['jobs']} longest: {jobs}"


def _company(pair: str, m: dict[str, Any]) -> str:
    urgent, lower = pair.split(" > ")
    within = f"within {MATCH_WINDOW_S / HOUR:g} h"
    if not m["jobs"]:
        return f"no {urgent} job of the same size {within} of a {lower} job"
    return (
        f"same size, submitted {within}: {urgent} {m[urgent + '_h']:.2f} h, "
        f"{lower} {m[lower + '_h']:.2f} h over {m['jobs']} {lower} jobs"
    )


def _your_trace(path: Path) -> Spec:
    """A trace the operator brings: its teams and classes as the file gives them (no random draw)."""

    def build(_seed: int, _openb: Path, _teams: int) -> list[TraceJob]:
        trace = load(path)
        jobs = trace.jobs
        if trace.bad_rows:  # the simulator's rule: bad rows are left out, and said so
            first = trace.bad_rows[0]
            print(
                f"fairness.py: {path}: left out {len(trace.bad_rows)} bad row(s), the first at line {first.line}: "
                f"{first.problem}",
                file=sys.stderr,
            )
        if len({j.priority for j in jobs}) < 2:
            print(f"fairness.py: {path} has one priority class: give it a `priority` column", file=sys.stderr)
        if not has_preemptible:
            print(f"fairness.py: {path}: {ALL_PREEMPTIBLE}", file=sys.stderr)
        return jobs

    has_preemptible = "preemptible" in _header(path)
    classes = "the file's priority and preemptible columns"
    return Spec("yours", build, (), classes if has_preemptible else f"{classes}; {ALL_PREEMPTIBLE}", seeds=1)


ALL_PREEMPTIBLE = (
    "no preemptible column: every job is preemptible, the column's default, so more urgent work may "
    "preempt any of it; mark work that must not be preempted false (e.g. true for low only)"
)


def _header(path: Path) -> list[str]:
    """The CSV's column names (none if it cannot be read: loading it says why)."""
    try:
        with path.open(newline="") as fh:
            return next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError):
        return []


def _fleet_sizes(text: str) -> tuple[int, ...] | None:
    """`--gpus`: comma-separated positive whole numbers, or None if it is not that."""
    sizes = [g.strip() for g in text.split(",")]
    return tuple(int(g) for g in sizes) if all(g.isdigit() and int(g) > 0 for g in sizes) else None


def _refused(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    unknown = [n.strip() for n in (args.traces or "").split(",") if n.strip() and n.strip() not in TRACES]
    if unknown:
        return f"unknown trace {', '.join(unknown)}; use {', '.join(TRACES)}, or --csv PATH for your own"
    if args.seeds is not None and args.seeds < 1:
        return "--seeds must be at least 1"
    if args.teams < 1:
        return "--teams must be at least 1"
    if args.gpus is not None and _fleet_sizes(args.gpus) is None:
        return f"--gpus {args.gpus!r}: give fleet sizes as positive whole numbers, comma-separated (e.g. 64,48)"
    if args.csv and args.gpus is None:
        return "--csv needs --gpus: fleet sizes that leave your trace under pressure (fifo waits hours), e.g. 64,48"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--traces", help=f"comma-separated, of {', '.join(TRACES)} (default: all of them, or none with --csv)"
    )
    ap.add_argument(
        "--csv",
        type=Path,
        action="append",
        default=[],
        help="a trace of your own in `chamber sim`'s CSV columns, its classes from the `priority` and "
        "`preemptible` columns (repeatable; needs --gpus)",
    )
    ap.add_argument(
        "--openb", type=Path, default=OPENB, help=f"the openb pod list CSV, or the folder holding it (default {OPENB})"
    )
    ap.add_argument("--seeds", type=int, help="seeds per trace (default 3; openb 2)")
    ap.add_argument(
        "--teams",
        type=int,
        default=RANDOM_TEAMS,
        help=f"teams the jobs of the ITP clusters and openb are drawn into (default {RANDOM_TEAMS}); "
        "the analogue keeps its four skewed teams, a --csv trace its own",
    )
    ap.add_argument("--gpus", help="override every trace's fleet sizes (comma-separated)")
    ap.add_argument("--json-only", action="store_true", help="no table on stderr")
    ap.add_argument(
        "--tuning",
        type=json.loads,
        default={},
        help="chamber policy fields as JSON, the same on every trace: to measure a candidate against the "
        "default (e.g. '{\"guard_lift_every_s\": 43200}'); the default policy runs without it",
    )
    add_fair_share_argument(ap)
    args = ap.parse_args()
    if (refused := _refused(args)) is not None:
        print(f"fairness.py: {refused}", file=sys.stderr)
        return 2
    names = [n.strip() for n in (args.traces or ("" if args.csv else ",".join(TRACES))).split(",") if n.strip()]
    specs = {n: TRACES[n] for n in names} | {f"csv:{p.name}": _your_trace(p) for p in args.csv}
    try:
        make_policy("chamber", args.tuning)
    except (TypeError, ValueError) as exc:
        print(f"fairness.py: --tuning: {exc}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {
        "policy": f"chamber with {json.dumps(args.tuning)} vs fifo" if args.tuning else "chamber (default) vs fifo",
        "quotas": "equal shares",
        "fair_share_factor": args.fair_share,
        "random_teams": args.teams,
        "traces": {},
        "runs": {},
    }
    sizes = _fleet_sizes(args.gpus) if args.gpus else None  # checked by _refused
    for name, spec in specs.items():
        gpus = sizes or spec.gpus
        seeds = spec.seeds if spec.split == "yours" else args.seeds or spec.seeds or 3  # yours: no random draw
        out["traces"][name] = {"split": spec.split, "classes": spec.classes, "gpus": list(gpus), "seeds": seeds}
        out["runs"][name] = {}
        for seed in range(seeds):
            try:
                jobs = spec.build(seed, args.openb, args.teams)
            except TraceError as exc:
                print(f"fairness.py: {name}: {exc}", file=sys.stderr)
                return 2
            for g in gpus:
                out["runs"][name][f"seed{seed}/{g}gpus"] = run_one(
                    jobs, g, args.tuning or None, fair_share=args.fair_share
                )
                print(f"{name} seed {seed} {g} GPUs done", file=sys.stderr)
    out["all_targets_met"] = all(r["all_targets_met"] for runs in out["runs"].values() for r in runs.values())
    out["met_by_split"] = met_by_split(out)
    out["met_within"] = met_within(out)
    if not args.json_only:
        print(table(out), file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
