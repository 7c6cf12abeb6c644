"""MIG (Multi-Instance GPU): per GPU model, the GPU-instance profiles and where each may be placed, and
the pure functions that say whether a profile still fits on a GPU with some instances already made.

A MIG-capable GPU has `compute_slices` compute slices and `memory_slices` memory slices (7 and 8 on
A100, H100 and H200; 4 and 4 on A30). A GPU instance of a profile takes `compute` compute slices and
`memory` memory slices, at one of the profile's legal start slices (in memory slices, as NVML's
`nvmlGpuInstancePlacement_t` counts them: `start` is the first memory slice, `size` how many). NVML
refuses an instance whose memory slices overlap one already made, so that is the rule here: a request
for a profile fits only if one of its legal placements is entirely free. On an 8-slice GPU a 4g
instance (only legal at 0) leaves memory slices 4-7, where only a 3g (at 4) or smaller fits.

The table is NVIDIA's: the MIG user guide's "Supported MIG Profiles" (profile names, fractions of
memory and SMs, instances available) and `nvidia-smi mig -lgipp` as the guide prints it for A100
and NVIDIA's H100 NVL post prints it (identical on every 8-memory-slice GPU):

    Profile ID 19 Placements: {0,1,2,3,4,5,6}:1     1g (smallest memory)
    Profile ID 20 Placements: {0,1,2,3,4,5,6}:1     1g+me (one per GPU: media engines)
    Profile ID 15 Placements: {0,2,4,6}:2           1g (double memory)
    Profile ID 14 Placements: {0,2,4}:2             2g
    Profile ID  9 Placements: {0,4}:4               3g
    Profile ID  5 Placement : {0}:4                 4g
    Profile ID  0 Placement : {0}:8                 7g

A30 (4 compute, 4 memory slices): 1g.6gb {0,1,2,3}:1, 2g.12gb {0,2}:2, 4g.24gb {0}:4 (and the +me
variants, one per GPU). `nvml_mismatches` compares this table with what NVML answers on a real GPU.

An instance's share of its GPU (for quotas, billing and packing) is the mean of its compute and memory
fractions, `(compute / compute_slices + memory / memory_slices) / 2`: instances never overlap in
either, so shares on one GPU add up to at most 1 (a 4g + a 3g on an H100 is exactly 1; seven 1g.10gb
are 15/16, the last memory slice being idle).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MILLI = 1000


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # "1g.10gb"
    nvml_profile: str  # the NVML_GPU_INSTANCE_PROFILE_* constant's suffix ("1_SLICE", "1_SLICE_REV2", ...)
    profile_id: int  # the id nvidia-smi prints (and NVML's profile info `id`)
    compute: int  # compute slices
    memory: int  # memory slices (the placement `size`)
    starts: tuple[int, ...]  # legal first memory slices
    memory_mib: int  # memory of the instance, as the profile name says (GB x 1024)
    max_instances: int | None = None  # a limit tighter than the placements (the +me profiles: 1)


@dataclass(frozen=True, slots=True)
class MigModel:
    model: str
    compute_slices: int
    memory_slices: int
    profiles: dict[str, MigProfile]

    def share_milli(self, profile: str) -> int:
        """The profile's share of this GPU in milli-GPU: the mean of its compute and memory fractions."""
        p = self.profiles[profile]
        return round(MILLI * (p.compute / self.compute_slices + p.memory / self.memory_slices) / 2)

    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1


def _eight_slice(model: str, gb: tuple[int, int, int, int, int, int]) -> MigModel:
    """An A100/H100/H200-style GPU: 7 compute and 8 memory slices; `gb` are the memory sizes in the
    profile names of 1g, 1g (double), 2g, 3g, 4g and 7g."""
    one, one2, two, three, four, seven = gb
    rows = [
        MigProfile(f"1g.{one}gb", "1_SLICE", 19, 1, 1, (0, 1, 2, 3, 4, 5, 6), one * 1024),
        MigProfile(f"1g.{one}gb+me", "1_SLICE_REV1", 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), one * 1024, 1),
        MigProfile(f"1g.{one2}gb", "1_SLICE_REV2", 15, 1, 2, (0, 2, 4, 6), one2 * 1024),
        MigProfile(f"2g.{two}gb", "2_SLICE", 14, 2, 2, (0, 2, 4), two * 1024),
        MigProfile(f"3g.{three}gb", "3_SLICE", 9, 3, 4, (0, 4), three * 1024),
        MigProfile(f"4g.{four}gb", "4_SLICE", 5, 4, 4, (0,), four * 1024),
        MigProfile(f"7g.{seven}gb", "7_SLICE", 0, 7, 8, (0,), seven * 1024),
    ]
    return MigModel(model, 7, 8, {p.name: p for p in rows})


def _a30(model: str) -> MigModel:
    rows = [
        MigProfile("1g.6gb", "1_SLICE", 14, 1, 1, (0, 1, 2, 3), 6 * 1024),
        MigProfile("1g.6gb+me", "1_SLICE_REV1", 21, 1, 1, (0, 1, 2, 3), 6 * 1024, 1),
        MigProfile("2g.12gb", "2_SLICE", 5, 2, 2, (0, 2), 12 * 1024),
        MigProfile("2g.12gb+me", "2_SLICE_REV1", 6, 2, 2, (0, 2), 12 * 1024, 1),
        MigProfile("4g.24gb", "4_SLICE", 0, 4, 4, (0,), 24 * 1024),
    ]
    return MigModel(model, 4, 4, {p.name: p for p in rows})


# Keyed by the model names Chamber's inventory uses (and NVML's product names' usual short forms).
MIG_MODELS: dict[str, MigModel] = {
    m.model: m
    for m in (
        _eight_slice("A100-40GB", (5, 10, 10, 20, 20, 40)),
        _eight_slice("A100-80GB", (10, 20, 20, 40, 40, 80)),
        _eight_slice("H100-80GB", (10, 20, 20, 40, 40, 80)),
        _eight_slice("H100-94GB", (12, 24, 24, 47, 47, 94)),  # H100 NVL
        _eight_slice("H200-141GB", (18, 35, 35, 71, 71, 141)),
        _a30("A30-24GB"),
    )
}
ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H200": "H200-141GB", "A30": "A30-24GB"}


class MigError(ValueError):
    """A model without MIG, or a profile the model does not have."""


def mig_model(model: str) -> MigModel | None:
    return MIG_MODELS.get(ALIASES.get(model, model))


def profile_of(model: str, profile: str) -> MigProfile:
    table = mig_model(model)
    if table is None:
        raise MigError(f"GPU model {model!r} has no MIG table (known: {', '.join(sorted(MIG_MODELS))})")
    if profile not in table.profiles:
        raise MigError(f"{model} has no MIG profile {profile!r} (it has {', '.join(table.profiles)})")
    return table.profiles[profile]


# --- layouts: the instances made on one GPU, as (profile name, start) -----------------------------------

Instance = tuple[str, int]


def span(profile: MigProfile, start: int) -> int:
    """The memory slices an instance at `start` takes, as a bit mask."""
    return ((1 << profile.memory) - 1) << start


def used_mask(table: MigModel, layout: Iterable[Instance]) -> int:
    mask = 0
    for name, start in layout:
        mask |= span(table.profiles[name], start)
    return mask


def free_starts(table: MigModel, layout: Iterable[Instance], profile: str) -> list[int]:
    """The legal starts where `profile` could be made now (empty: it does not fit)."""
    layout = list(layout)
    p = table.profiles[profile]
    if p.max_instances is not None and sum(1 for name, _ in layout if name == profile) >= p.max_instances:
        return []
    used = used_mask(table, layout)
    return [s for s in p.starts if not used & span(p, s)]


def _marker(table: MigModel, profile: MigProfile) -> int:
    """A bit above the memory slices that says a one-per-GPU profile (the +me ones) is made."""
    if profile.max_instances != 1:
        return 0
    limited = [name for name, p in table.profiles.items() if p.max_instances == 1]
    return 1 << (table.memory_slices + limited.index(profile.name))


def occupancy(table: MigModel, profile: str, start: int) -> int:
    """What an instance takes of a GPU's compact state: its memory slices, and for a one-per-GPU
    profile its marker bit (so a used-slice mask also knows the GPU has one)."""
    p = table.profiles[profile]
    return span(p, start) | _marker(table, p)


def starts_in_mask(table: MigModel, used: int, profile: str) -> list[int]:
    """`free_starts` on a compact state built with `occupancy` (the packer's)."""
    p = table.profiles[profile]
    if used & _marker(table, p):
        return []
    return [s for s in p.starts if not used & span(p, s)]


def fits(table: MigModel, layout: Iterable[Instance], profile: str) -> bool:
    return bool(free_starts(table, layout, profile))


def place(table: MigModel, layout: Iterable[Instance], profile: str, start: int) -> tuple[Instance, ...]:
    """The layout with one more instance; MigError where the placement is not legal or not free."""
    layout = tuple(layout)
    if profile not in table.profiles:
        raise MigError(f"{table.model} has no MIG profile {profile!r}")
    if start not in free_starts(table, layout, profile):
        raise MigError(f"{profile} cannot be made at slice {start} on {table.model} with {list(layout)}")
    return tuple(sorted((*layout, (profile, start)), key=lambda i: (i[1], i[0])))


def most_instances(table: MigModel, used: int, profile: str) -> int:
    """How many more instances of `profile` fit in the free slices (greedy from the lowest start,
    which is the most for one profile: its placements are aligned to their size)."""
    p = table.profiles[profile]
    if used & _marker(table, p):
        return 0
    count = 0
    for s in p.starts:
        if not used & span(p, s):
            used |= span(p, s)
            count += 1
            if p.max_instances is not None and count >= p.max_instances:
                break
    return count


# --- checking the table against NVML --------------------------------------------------------------------


def nvml_placements(nvml: Any, handle: Any, profile_constant: int) -> tuple[int, int, list[tuple[int, int]]] | None:
    """(profile id, compute slices, [(start, size)]) NVML gives for one NVML_GPU_INSTANCE_PROFILE_*
    constant, or None where the GPU does not have that profile. `nvml` is the `pynvml` module."""
    try:
        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_constant)
    except nvml.NVMLError:
        return None
    capacity = 16
    placements = (nvml.c_nvmlGpuInstancePlacement_t * capacity)()
    count = ctypes.c_uint(capacity)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements, ctypes.byref(count))
    return int(info.id), int(info.sliceCount), [(int(p.start), int(p.size)) for p in placements[: count.value]]


REFUSED = "NVML refused"  # a mismatch line that says the check could not be made (e.g. not privileged)


def nvml_mismatches(nvml: Any, handle: Any, model: str) -> list[str]:
    """Where this module's table for `model` and the GPU's NVML disagree (empty: they agree). Run it on a
    GPU of that model (MIG mode need not be on: NVML lists possible placements either way)."""
    table = mig_model(model)
    if table is None:
        return [f"no MIG table for {model!r}"]
    out: list[str] = []
    for p in table.profiles.values():
        constant = getattr(nvml, f"NVML_GPU_INSTANCE_PROFILE_{p.nvml_profile}")
        try:
            answer = nvml_placements(nvml, handle, constant)
        except nvml.NVMLError as exc:
            out.append(f"{p.name}: {REFUSED} the placements ({exc})")
            continue
        if answer is None:
            out.append(f"{p.name}: NVML has no profile {p.nvml_profile}")
            continue
        pid, compute, placements = answer
        expected = [(s, p.memory) for s in p.starts]
        if pid != p.profile_id:
            out.append(f"{p.name}: NVML profile id {pid}, table {p.profile_id}")
        if compute != p.compute:
            out.append(f"{p.name}: NVML {compute} compute slices, table {p.compute}")
        if sorted(placements) != expected:
            out.append(f"{p.name}: NVML placements {sorted(placements)}, table {expected}")
    return out


def main() -> int:
    """`python -m services.scheduler.core.mig`: on a GPU node, compare the table with NVML for every GPU
    and print one JSON line per GPU (`mismatches` empty: the table holds). Exit 1 on a disagreement,
    2 without an NVIDIA driver; where NVML refuses the question (not privileged) the line says so."""
    import json
    import sys

    from node_agent.nvml_adapter import normalized_model

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: say so, no traceback
        print(f"mig check: NVML unavailable ({exc})", file=sys.stderr)
        return 2
    bad = False
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            model = normalized_model(name, pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20)
            found = nvml_mismatches(pynvml, handle, model)
            bad |= mig_model(model) is not None and any(REFUSED not in line for line in found)
            print(json.dumps({"gpu": i, "name": name, "model": model, "mismatches": found}))
    finally:
        pynvml.nvmlShutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
