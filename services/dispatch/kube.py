"""The dispatch actuator's adapter over the real `kubernetes` client: the workload listing and patches
of services/kube/cluster.py, plus creating and deleting a workload of any kind and the cluster's GPU
capacity (allocatable GPUs of its nodes, for the heartbeat)."""

from __future__ import annotations

from typing import Any

from services.kube.cluster import KubernetesWorkloads
from services.kube.kinds import BatchJob, Pod, WorkloadKind
from services.kube.resources import GPU_RESOURCES

BACKGROUND = "Background"  # a deleted Job's pods go with it (kubectl's default since 1.27 for Jobs)


class DispatchWorkloads(KubernetesWorkloads):
    def create(self, kind: WorkloadKind, namespace: str, body: dict[str, Any]) -> None:
        if isinstance(kind, BatchJob):
            self.batch.create_namespaced_job(namespace, body)  # type: ignore[arg-type]  # a dict body goes as JSON
        elif isinstance(kind, Pod):
            self.core.create_namespaced_pod(namespace, body)  # type: ignore[arg-type]  # a dict body goes as JSON
        else:
            self.custom.create_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, body)

    def delete(self, kind: WorkloadKind, namespace: str, name: str) -> bool:
        """Delete it (False: it was gone already)."""
        from kubernetes.client.exceptions import ApiException

        try:
            if isinstance(kind, BatchJob):
                self.batch.delete_namespaced_job(name, namespace, propagation_policy=BACKGROUND)
            elif isinstance(kind, Pod):
                self.core.delete_namespaced_pod(name, namespace)
            else:
                self.custom.delete_namespaced_custom_object(
                    kind.group, kind.version, namespace, kind.plural, name, propagation_policy=BACKGROUND
                )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def capacity_gpus(self) -> int:
        """Allocatable GPUs over the cluster's schedulable nodes."""
        total = 0
        for node in self.core.list_node().items or []:
            if node.spec is not None and node.spec.unschedulable:
                continue
            allocatable = (node.status.allocatable if node.status is not None else None) or {}
            for resource in GPU_RESOURCES:
                try:
                    total += int(allocatable.get(resource, "0"))
                except ValueError:
                    continue
        return total
