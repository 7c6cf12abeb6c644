"""Applying the MIG layouts the scheduler planned (core/mig_live.py) on Kubernetes, through the NVIDIA GPU
Operator's MIG manager, as NVIDIA documents it: per node, one step per round (level-triggered, so a missed
or repeated round is harmless):

1. the node's layouts (every GPU: the planned layout, or the one it has) are written as one entry of the
   MIG manager's mig-parted ConfigMap (`--mig-config-map NAMESPACE/NAME`, which the GPU Operator's
   ClusterPolicy must name as `migManager.config.name`), under a name derived from the layouts;
2. the node is cordoned (annotated `chamber.io/mig-cordoned`, so only a cordon Chamber made is lifted);
3. Chamber waits until no pod on the node holds an NVIDIA GPU, MIG instance or DRA claim (the scheduler
   places nothing there while the change is pending);
4. the `nvidia.com/mig.config` label is set to the entry's name (and the old `nvidia.com/mig.config.state`
   removed, so a stale `success` is never read as this change's);
5. once the MIG manager reports `nvidia.com/mig.config.state=success`, the node is uncordoned and each
   changed GPU's `MigLayoutApplied` is published: the scheduler then places into the new instances.

A `failed` state leaves the node cordoned and the change pending (the scheduler keeps work off it): the
MIG manager's logs say why, and an operator decides (fix and set the label again, or reboot). Chamber
posts one Warning Event on the Node (`ChamberMigConfigFailed`) saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import yaml

from events.codec import stable_id
from events.fleet import MigInstance, MigLayoutApplied
from services.kube.mig_config import Step, config_entry, config_name, next_step, release_patch
from services.scheduler.core.mig_live import abandoned, reconfiguring

if TYPE_CHECKING:
    from services.scheduler.core.mig import Instance
    from services.scheduler.core.state import SchedulerState

CONFIG_KEY = "config.yaml"  # the key mig-parted's ConfigMap holds its configuration under
DEFAULT_CONFIG_MAP = "gpu-operator/chamber-mig-parted-config"
FAILED_REASON = "ChamberMigConfigFailed"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeChange:
    """One node's pending MIG change: the mig-parted entry for all its GPUs and the GPUs that change."""

    node: str
    config: str
    entry: list[dict[str, Any]]
    gpus: tuple[tuple[int, tuple[Instance, ...], bool, float | None], ...]  # index, layout, MIG on, planned at


def pending_changes(state: SchedulerState, cluster: str) -> list[NodeChange]:
    """The nodes of `cluster` with a planned MIG change not applied yet."""
    out: list[NodeChange] = []
    for nid in sorted(state.mig_nodes):
        node = state.node_by_id[nid]
        if node.cluster != cluster or not reconfiguring(node):
            continue
        layouts: dict[int, list[Instance] | None] = {}
        changing: list[tuple[int, tuple[Instance, ...], bool, float | None]] = []
        for gpu in sorted(node.gpus):
            st = node.mig.get(gpu)
            if st is None:
                layouts[gpu] = None
            elif st.pending is not None:
                layouts[gpu] = list(st.pending) if st.pending_enabled else None
                changing.append((gpu, st.pending, st.pending_enabled, st.changed_at))
            else:
                layouts[gpu] = list(st.layout) if st.enabled else None
        entry = config_entry(layouts)
        out.append(NodeChange(node.name, config_name(entry), entry, tuple(changing)))
    return out


def abandoned_nodes(state: SchedulerState, cluster: str) -> list[tuple[str, float]]:
    """(node, when) for the nodes of `cluster` whose last change an operator abandoned."""
    out = []
    for nid in sorted(state.mig_nodes):
        node = state.node_by_id[nid]
        when = abandoned(node) if node.cluster == cluster else None
        if when is not None:
            out.append((node.name, when))
    return out


def applied_events(cluster: str, change: NodeChange, now: float) -> list[tuple[MigLayoutApplied, str]]:
    """The `MigLayoutApplied` of each GPU the change made (ids stable per planned change)."""
    return [
        (
            MigLayoutApplied(
                cluster=cluster,
                node=change.node,
                gpu_index=gpu,
                at=now,
                layout=[MigInstance(profile=p, start=s) for p, s in layout],
                mig_enabled=enabled,
                planned_at=planned_at,
            ),
            stable_id("mig-applied", cluster, change.node, gpu, planned_at),
        )
        for gpu, layout, enabled, planned_at in change.gpus
    ]


def with_entry(text: str | None, name: str, entry: list[dict[str, Any]]) -> str | None:
    """mig-parted's configuration with `name: entry` in `mig-configs`; None when it has it already."""
    doc = yaml.safe_load(text or "") or {}
    doc.setdefault("version", "v1")
    configs = doc.setdefault("mig-configs", {})
    if configs.get(name) == entry:
        return None
    configs[name] = entry
    return str(yaml.safe_dump(doc, sort_keys=True))


def holds_gpus(pod: dict[str, Any]) -> bool:
    """A pod that is not finished and asks for an NVIDIA GPU, a MIG instance or a DRA claim."""
    if ((pod.get("status") or {}).get("phase")) in DONE_PHASES:
        return False
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for key in [*(res.get("limits") or {}), *(res.get("requests") or {})]:
            if key.startswith(GPU_RESOURCES):
                return True
    return False


class MigApplier:
    """The GPU Operator procedure over the real `kubernetes` client (blocking: run it in a thread)."""

    def __init__(self, api_client: Any, config_map: str = DEFAULT_CONFIG_MAP) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.namespace, _, self.name = config_map.partition("/")
        self.told: set[tuple[str, str]] = set()  # (node, config) failures already posted as an Event

    def step(self, change: NodeChange, now: float) -> Step:
        """One step of the procedure for one node (the patch, if any, is sent)."""
        cm = self.core.read_namespaced_config_map(self.name, self.namespace)
        text = with_entry((cm.data or {}).get(CONFIG_KEY), change.config, change.entry)
        if text is not None:
            self.core.patch_namespaced_config_map(self.name, self.namespace, {"data": {CONFIG_KEY: text}})
        node = self.api_client.sanitize_for_serialization(self.core.read_node(change.node))
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={change.node}").items
        busy = sum(holds_gpus(self.api_client.sanitize_for_serialization(p)) for p in pods)
        step = next_step(node, change.config, busy)
        if step.patch is not None:
            self.core.patch_node(change.node, step.patch)
        elif "failed" in step.wait and (change.node, change.config) not in self.told:
            self.told.add((change.node, change.config))
            self._warn(node, step.wait, now)
        return step

    def release(self, name: str) -> bool:
        """Lift Chamber's cordon of a node whose change an operator abandoned; whether it lifted one."""
        node = self.api_client.sanitize_for_serialization(self.core.read_node(name))
        patch = release_patch(node)
        if patch is not None:
            self.core.patch_node(name, patch)
        return patch is not None

    def _warn(self, node: dict[str, Any], message: str, now: float) -> None:
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = node.get("metadata") or {}
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": meta.get("name"), "uid": meta.get("uid")},
            "type": "Warning",
            "reason": FAILED_REASON,
            "message": message[:1024],
            "source": {"component": "chamber-scheduler"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.core.create_namespaced_event("default", body)  # type: ignore[arg-type]
