"""The adapter over the real `kubernetes` client: which workload kinds this cluster serves, list the
ones that name a team or a Kueue queue, apply Chamber's JSON patches, and post Events.

A kind whose CRD is not installed is found missing once, at start (the API server's group list),
and skipped with one log line; the batch Job, Pod, Deployment and StatefulSet kinds are always there.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from services.kube.bindings import KUEUE_QUEUE_LABEL, TEAM_LABEL
from services.kube.kinds import KINDS, BatchJob, Observed, Pod, WorkloadKind
from services.kube.resources import WorkloadError
from services.kube.serving import SERVING_KINDS, Deployment, StatefulSet

JSON_PATCH = "application/json-patch+json"
SELECTORS = (TEAM_LABEL, KUEUE_QUEUE_LABEL)  # a selector cannot say "either", so one list each


DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first: ResourceClaimTemplates are read in the first served


def names_templates(observed: Observed) -> bool:
    """Some pod of the workload asks for devices through a ResourceClaimTemplate."""
    try:
        groups = observed.kind.groups(observed.obj)
    except WorkloadError:  # a malformed workload: the reconcile says what is wrong with it
        return False
    return any(ref.get("resourceClaimTemplateName") for g in groups for ref in g.spec.get("resourceClaims") or [])


def serves(available: set[tuple[str, str]], kind: WorkloadKind) -> bool:
    return kind.group in ("", "batch", "apps") or (kind.group, kind.version) in available


class KubernetesWorkloads:
    def __init__(self, api_client: Any, kinds: tuple[WorkloadKind, ...] = KINDS + SERVING_KINDS) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.apis = client.ApisApi(api_client)
        self.kinds = kinds
        self.dra_version: str | None = None  # the resource.k8s.io version served (DRA), once detected

    def detect(self, log: Callable[[WorkloadKind], None]) -> tuple[WorkloadKind, ...]:
        """Keep the kinds the API server serves; `log(kind)` once for each one skipped."""
        groups = self.apis.get_api_versions().groups or []
        available = {(g.name, v.version) for g in groups for v in g.versions or []}
        self.dra_version = next((v for v in DRA_VERSIONS if (DRA_GROUP, v) in available), None)
        kept = []
        for kind in self.kinds:
            if serves(available, kind):
                kept.append(kind)
            else:
                log(kind)
        self.kinds = tuple(kept)
        return self.kinds

    def _list(self, kind: WorkloadKind, selector: str) -> list[Any]:
        if isinstance(kind, BatchJob):
            return list(self.batch.list_job_for_all_namespaces(label_selector=selector).items)
        if isinstance(kind, Pod):
            return list(self.core.list_pod_for_all_namespaces(label_selector=selector).items)
        if isinstance(kind, Deployment):
            return list(self.apps.list_deployment_for_all_namespaces(label_selector=selector).items)
        if isinstance(kind, StatefulSet):
            return list(self.apps.list_stateful_set_for_all_namespaces(label_selector=selector).items)
        # custom objects come back as the API's JSON (a dict); the client annotates them as `object`
        found = cast(
            "dict[str, Any]",
            self.custom.list_cluster_custom_object(kind.group, kind.version, kind.plural, label_selector=selector),
        )
        return list(found.get("items") or [])

    def list(self) -> list[Observed]:
        found: list[Observed] = []
        for kind in self.kinds:
            seen: set[str] = set()
            for selector in SELECTORS:
                for item in self._list(kind, selector):
                    obj = self.api_client.sanitize_for_serialization(item)
                    obj.setdefault("apiVersion", kind.api_version)
                    obj.setdefault("kind", kind.kind)
                    uid = (obj.get("metadata") or {}).get("uid") or obj["metadata"]["name"]
                    if uid not in seen:
                        seen.add(uid)
                        found.append(Observed(kind, obj))
        return found

    def claim_templates(self, listed: builtins.list[Observed]) -> dict[str, dict[str, dict[str, Any]]]:
        """namespace -> name -> ResourceClaimTemplate, for the namespaces whose listed workloads have pods
        naming a template (DRA: a claim made from a template is read as the template's spec asks)."""
        if self.dra_version is None:
            return {}
        namespaces = sorted({str(o.obj["metadata"].get("namespace") or "") for o in listed if names_templates(o)})
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for ns in namespaces:
            found = cast(
                "dict[str, Any]",
                self.custom.list_namespaced_custom_object(DRA_GROUP, self.dra_version, ns, "resourceclaimtemplates"),
            )
            out[ns] = {item["metadata"]["name"]: item for item in found.get("items") or []}
        return out

    def patch(self, kind: WorkloadKind, namespace: str, name: str, ops: builtins.list[dict[str, Any]]) -> None:
        if not ops:
            return
        if isinstance(kind, BatchJob):
            self.batch.patch_namespaced_job(name, namespace, ops)  # a list body goes as JSON Patch
        elif isinstance(kind, Pod):
            self.core.patch_namespaced_pod(name, namespace, ops)
        else:
            self.custom.patch_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name, ops, _content_type=JSON_PATCH
            )

    def delete_pod(self, namespace: str, name: str) -> None:
        """A preempted serving replica's pod (its controller makes it again, gated)."""
        self.core.delete_namespaced_pod(name, namespace)

    def event(
        self, kind: WorkloadKind, namespace: str, name: str, uid: str, reason: str, message: str, now: float
    ) -> None:
        """A Warning Event on the workload, as `kubectl describe` shows it."""
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": kind.api_version,
                "kind": kind.kind,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "chamber-scheduler"},
            "reportingComponent": "chamber.io/scheduler",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        # the client serializes a dict body as it does a CoreV1Event (its annotation names only the model)
        self.core.create_namespaced_event(namespace, body)  # type: ignore[arg-type]


class Refusal(Protocol):
    """A workload Chamber will not run, and why (the scheduler's and dispatch's `Refuse` actions)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def reason(self) -> str: ...


async def refuse_once(
    workloads: KubernetesWorkloads,
    refused: set[str],
    kind: WorkloadKind,
    refusal: Refusal,
    now: float,
    log: Any,
    what: str,
) -> None:
    """Say once why a workload is refused: in the log (`what`) and as a `ChamberRefused` Event on it.

    The uid is remembered before the Event is posted, so an API server that refuses Events does not
    turn one refusal into a warning per cycle.
    """
    from kubernetes.client.exceptions import ApiException

    namespace, name, uid, reason = refusal.namespace, refusal.name, refusal.uid, refusal.reason
    if uid in refused:
        return
    refused.add(uid)
    log.warning(what, kind=kind.kind, namespace=namespace, name=name, reason=reason)
    try:
        await asyncio.to_thread(workloads.event, kind, namespace, name, uid, "ChamberRefused", reason, now)
    except ApiException as exc:
        log.warning("could not post the Event", name=name, status=exc.status)
