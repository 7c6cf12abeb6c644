"""Alibaba's 2023 GPU pod trace (`openb_pod_list_default.csv`, cluster-trace-gpu-v2023) as simulator jobs.

The trace lists 8,152 pods of a production GPU cluster with their Kubernetes QoS class, GPU request
and creation / scheduled / deletion times, but no team. The mapping (data/traces/alibaba-openb/SOURCE.md):

  - class: Guaranteed -> critical, LS (latency sensitive) -> high, Burstable -> normal,
    BE (best effort) -> low; only low is preemptible (best effort is what the cluster evicts);
  - GPUs: `num_gpu`; a GPU-sharing pod (`gpu_milli` < 1000 on one GPU) takes a whole GPU, since the
    simulator allocates whole GPUs; pods without a GPU are left out;
  - submit: `creation_time`; run length: `deletion_time - scheduled_time` (pods never scheduled
    are left out: they never ran, so the trace does not say how long they would have);
  - team: none in the trace, so each pod joins one of `teams` teams by a seeded draw on its name
    (the same seed gives the same teams anywhere; several seeds show the spread).
Times are re-based so the first kept pod is submitted at 0.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from events import PriorityClass
from services.tracesim.trace import TraceError, TraceJob

QOS_CLASS = {
    "Guaranteed": PriorityClass.CRITICAL,
    "LS": PriorityClass.HIGH,
    "Burstable": PriorityClass.NORMAL,
    "BE": PriorityClass.LOW,
}
COLUMNS = ("name", "num_gpu", "qos", "creation_time", "deletion_time", "scheduled_time")
SOURCE = "https://github.com/alibaba/clusterdata/blob/master/cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv"


def load_openb(path: Path, *, seed: int = 0, teams: int = 4) -> list[TraceJob]:
    """The GPU pods of the openb trace that ran, as jobs (see the module's mapping)."""
    if teams < 1:
        raise TraceError("teams must be at least 1")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: not an openb pod list: missing column(s) {', '.join(missing)}")
            rows = list(reader)
    except FileNotFoundError:
        raise TraceError(f"openb trace {path} does not exist; download it from {SOURCE}") from None
    jobs: list[TraceJob] = []
    for line, r in enumerate(rows, start=2):
        try:
            gpus = int(r["num_gpu"])
            if gpus < 1 or not r["scheduled_time"].strip():
                continue
            submit = float(r["creation_time"])
            duration = float(r["deletion_time"]) - float(r["scheduled_time"])
        except ValueError:
            raise TraceError(f"{path}:{line}: a number column is not a number") from None
        if duration <= 0:
            continue
        cls = QOS_CLASS.get(r["qos"].strip())
        if cls is None:
            raise TraceError(f"{path}:{line}: qos is {r['qos']!r}; expected one of {', '.join(QOS_CLASS)}")
        name = r["name"].strip()
        team = f"team-{random.Random(f'{seed}:{name}').randrange(teams)}"
        jobs.append(TraceJob(name, submit, duration, gpus, team, cls, preemptible=cls == PriorityClass.LOW))
    if not jobs:
        raise TraceError(f"{path}: no GPU pod that ran")
    start = min(j.submit_s for j in jobs)
    out = [
        TraceJob(j.id, j.submit_s - start, j.duration_s, j.gpus, j.team, j.priority, preemptible=j.preemptible)
        for j in jobs
    ]
    out.sort(key=lambda j: (j.submit_s, j.id))
    return out
