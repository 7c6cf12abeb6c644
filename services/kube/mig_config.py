"""Applying a planned MIG layout on Kubernetes through the NVIDIA GPU Operator, as NVIDIA documents it:
the node's `nvidia.com/mig.config` label names a configuration in the MIG manager's mig-parted
ConfigMap; the MIG manager applies it and reports `nvidia.com/mig.config.state` (`pending`,
`rebooting`, `success`, `failed`). Chamber cordons the node first, waits until no pod uses a GPU the
change touches, sets the label, waits for `success`, and uncordons (only if it cordoned).

mig-parted configures by count of each profile per GPU, not by start slice, and recreates every
instance of a GPU whose configuration changes: a plan applied this way is made with
`plan(..., rewrites_whole_gpu=True)`, so it only changes GPUs none of whose instances hold work.

`config_entry` writes the ConfigMap entry for a node's layouts; `next_step` is the level-triggered
procedure: given the node object as read and how many pods still use the GPUs being changed, the one
patch to send next (or why to wait).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
CORDONED = "chamber.io/mig-cordoned"  # "true" while Chamber holds the node cordoned for a MIG change

Layout = Iterable[tuple[str, int]]  # (profile, start) per instance


def config_entry(layouts: Mapping[int, Layout | None]) -> list[dict[str, Any]]:
    """mig-parted's per-device list for one node: GPU index -> its instances (None: MIG off)."""
    out: list[dict[str, Any]] = []
    for index in sorted(layouts):
        layout = layouts[index]
        if layout is None:
            out.append({"devices": [index], "mig-enabled": False})
            continue
        counts = Counter(profile for profile, _ in layout)
        out.append({"devices": [index], "mig-enabled": True, "mig-devices": dict(sorted(counts.items()))})
    return out


def config_name(entry: list[dict[str, Any]]) -> str:
    """A stable name for an entry (the same layouts give the same name on every node)."""
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:12]
    return f"chamber-{digest}"


@dataclass(frozen=True)
class Step:
    """The next thing to do: a node patch (strategic merge body), or nothing yet (`wait` says why)."""

    patch: dict[str, Any] | None = None
    wait: str = ""
    done: bool = False


def release_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """After an operator abandoned the change: lift the cordon Chamber set for it (None: none to lift)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    if annotations.get(CORDONED) != "true":
        return None
    return {"spec": {"unschedulable": False}, "metadata": {"annotations": {CORDONED: None}}}


def next_step(node: dict[str, Any], want: str, busy_pods: int) -> Step:
    """Where the documented procedure stands for `node` (as read) and the config `want`."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    ours = annotations.get(CORDONED) == "true"
    if labels.get(CONFIG_LABEL) == want:
        state = labels.get(STATE_LABEL)
        if state == "failed":
            return Step(wait=f"the MIG manager failed to apply {want}; the node stays cordoned for an operator")
        if state != "success":
            return Step(wait=f"the MIG manager is applying {want} (state {state or 'unknown'})")
        if ours:
            return Step(patch={"spec": {"unschedulable": False}, "metadata": {"annotations": {CORDONED: None}}})
        return Step(done=True)
    if not spec.get("unschedulable"):
        return Step(patch={"spec": {"unschedulable": True}, "metadata": {"annotations": {CORDONED: "true"}}})
    if busy_pods:
        return Step(wait=f"{busy_pods} pods still use the GPUs the change touches")
    # the state label goes with the old config: until the MIG manager writes it again, nothing reads as success
    return Step(patch={"metadata": {"labels": {CONFIG_LABEL: want, STATE_LABEL: None}}})
