"""`chamber sim place`: place a sequence of pods on an inventory with the scheduler's own shared-GPU
packer, once each, in order, irrevocably (no departures, retries or preemption).

Formats follow Alibaba's public openb v2023 trace (cluster-trace-gpu-v2023):
- nodes: `sn,cpu_milli,memory_mib,gpu,model`
- arrivals: `arrival_idx,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec` (`arrival_idx` optional:
  file order otherwise; `gpu_spec` a `|`-separated allow-list of node models, empty for any). The
  trace's own pod lists (`name,cpu_milli,...,gpu_spec,qos,...`) are accepted as they are.

MIG (optional columns, not in the openb trace): a node with `mig` set (1, true or yes) has its GPUs in
MIG mode; an arrival with `mig_profile` (e.g. 1g.10gb) asks for one instance of it. A placed MIG
arrival's entry also names the instance's start slice: `[node, [gpu], start]`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.scheduler.core.mig import MigError, mig_model
from services.scheduler.core.sharing import MILLI, Mix, NodeSpec, Packer, PodRequest, mig_request_on_any

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class PlaceInputError(ValueError):
    """An inventory or arrivals file that cannot be used; the message names the file and line."""


def _int(value: str | None, what: str, where: str, low: int = 0, high: int | None = None) -> int:
    text = (value or "").strip()
    try:
        number = int(float(text)) if text else 0
    except ValueError:
        raise PlaceInputError(f"{where}: {what} is {text!r}, not a number") from None
    if number < low or (high is not None and number > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise PlaceInputError(f"{where}: {what} is {number}, outside {bound}")
    return number


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise PlaceInputError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise PlaceInputError(f"{path}: missing column(s) {', '.join(missing)} (has {reader.fieldnames})")
        yield from enumerate(reader, start=2)


def read_nodes(path: Path) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        where = f"{path}:{line}"
        name = (row["sn"] or "").strip()
        if not name or name in seen:
            raise PlaceInputError(f"{where}: node name {name!r} is empty or repeated")
        seen.add(name)
        model = (row["model"] or "").strip()
        mig = (row.get("mig") or "").strip().lower() in ("1", "true", "yes")
        if mig and mig_model(model) is None:
            raise PlaceInputError(f"{where}: mig is set but model {model!r} has no MIG table")
        nodes.append(
            NodeSpec(
                name=name,
                cpu_milli=_int(row["cpu_milli"], "cpu_milli", where),
                memory_mib=_int(row["memory_mib"], "memory_mib", where),
                gpus=_int(row["gpu"], "gpu", where, high=64),
                model=model,
                mig=mig,
            )
        )
    if not nodes:
        raise PlaceInputError(f"{path}: no nodes")
    return nodes


def pod_from_row(row: dict[str, str], where: str) -> PodRequest:
    num_gpu = _int(row["num_gpu"], "num_gpu", where, high=64)
    gpu_milli = _int(row["gpu_milli"], "gpu_milli", where, high=MILLI)
    if num_gpu and not gpu_milli:
        gpu_milli = MILLI  # a GPU count without a share means whole GPUs
    spec = (row.get("gpu_spec") or "").strip()
    models = frozenset(m for m in spec.split("|") if m and m.lower() != "nan")
    profile = (row.get("mig_profile") or "").strip()
    if profile:
        return _mig_pod(row, where, profile, num_gpu, models)
    return PodRequest(
        cpu_milli=_int(row["cpu_milli"], "cpu_milli", where),
        memory_mib=_int(row["memory_mib"], "memory_mib", where),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli if num_gpu else 0,
        models=models,
    )


def _mig_pod(row: dict[str, str], where: str, profile: str, num_gpu: int, models: frozenset[str]) -> PodRequest:
    if num_gpu not in (0, 1):
        raise PlaceInputError(f"{where}: a MIG arrival takes one instance; num_gpu is {num_gpu}")
    cpu = _int(row["cpu_milli"], "cpu_milli", where)
    try:
        return mig_request_on_any(profile, models, cpu, _int(row["memory_mib"], "memory_mib", where))
    except MigError as exc:
        raise PlaceInputError(f"{where}: {exc}") from None


def read_arrivals(path: Path) -> list[PodRequest]:
    ordered: list[tuple[int, int, PodRequest]] = []
    for line, row in _rows(path, POD_COLUMNS):
        where = f"{path}:{line}"
        idx = _int(row["arrival_idx"], "arrival_idx", where) if "arrival_idx" in row else line
        ordered.append((idx, line, pod_from_row(row, where)))
    ordered.sort(key=lambda t: (t[0], t[1]))
    return [pod for _, _, pod in ordered]


@dataclass(frozen=True)
class Replay:
    scheduler: str
    placements: list[list[object] | None]
    allocated_milli: int
    capacity_milli: int


def replay(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], policy: str, mix: Mix | None = None) -> Replay:
    """Place every pod in order. The expected mix is the arrivals' own shapes (FGD's "typical pods" from
    the workload), unless one is given."""
    packer = Packer(nodes, policy=policy, mix=mix if mix is not None else Mix.of(pods))
    out: list[list[object] | None] = []
    for pod in pods:
        spot = packer.place_at(pod)
        if spot is None:
            out.append(None)
        else:
            out.append([spot.node, spot.gpus] if spot.mig_start is None else [spot.node, spot.gpus, spot.mig_start])
    return Replay(policy, out, packer.allocated_milli(), packer.capacity_milli())
