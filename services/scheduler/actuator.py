"""The scheduler's Kubernetes actuator (`--kubernetes`): each round, list this cluster's workloads,
reconcile them with the scheduler's state (`services.scheduler.kubernetes.reconcile`, and
`services.scheduler.serving.reconcile_serving` for serving workloads, both pure), publish
what it learnt (submitted, completed, failed) and apply the patches; refusals become one Event each.
Only the leader runs it (the scheduler's tick checks `synced`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from services.kube.cluster import refuse_once
from services.runtime.logs import get_logger
from services.scheduler.kubernetes import Refuse, reconcile
from services.scheduler.serving import DeletePod, reconcile_serving, split

if TYPE_CHECKING:
    from services.scheduler.mig_apply import MigApplier
    from services.scheduler.service import Scheduler

log = get_logger("chamber.scheduler")


class KubernetesActuator:
    """Level-triggered reconciliation of this cluster's workloads with the scheduler's state."""

    def __init__(
        self,
        scheduler: Scheduler,
        cluster: str,
        bindings_file: str | None = None,
        kubeconfig: str | None = None,
        mig_config_map: str | None = None,
    ) -> None:
        """`kubeconfig`: another cluster's credentials (`--kubernetes-cluster NAME=FILE`); else in-cluster
        or the default kubeconfig. `mig_config_map` (NAMESPACE/NAME): apply planned MIG layouts through the
        GPU Operator (services/scheduler/mig_apply.py)."""
        from kubernetes import client, config

        from services.kube.bindings import Bindings, BindingsError
        from services.kube.cluster import KubernetesWorkloads

        api_client: Any = None
        if kubeconfig:
            try:
                api_client = config.new_client_from_config(config_file=kubeconfig)
            except (config.ConfigException, OSError) as exc:
                raise SystemExit(f"chamber scheduler --kubernetes-cluster {cluster}={kubeconfig}: {exc}") from None
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except config.ConfigException as exc:
                    raise SystemExit(f"chamber scheduler --kubernetes: no cluster to talk to ({exc})") from None
        try:
            self.bindings = Bindings.load(bindings_file)
        except BindingsError as exc:
            raise SystemExit(f"chamber scheduler: {exc}") from None
        if self.bindings.open:
            log.warning("no --bindings file: any namespace may charge any team")
        self.workloads = KubernetesWorkloads(api_client or client.ApiClient())
        self.mig: MigApplier | None = None
        self.released: set[tuple[str, float]] = set()  # (node, abandoned at): Chamber's cordon lifted
        if mig_config_map:
            from services.scheduler.mig_apply import MigApplier

            self.mig = MigApplier(self.workloads.api_client, mig_config_map)
        self.detected = False
        self.refused: set[str] = set()  # uids already given their Event
        self.scheduler = scheduler
        self.cluster = cluster
        self.step_logs: dict[str, bytes] | None = None  # what the bucket holds (services/scheduler/step_logs.py)
        self._step_log_kv: Any = None

    async def _hand_out_step_logs(self, listed: Any) -> None:
        """The step logs running workloads name, to their nodes' agents (a failure waits a round)."""
        from events.channels import STEP_LOG_BUCKET
        from services.scheduler.step_logs import desired_step_logs, sync_step_logs

        sched = self.scheduler
        assert sched.host is not None
        desired = desired_step_logs(sched.state, listed, self.cluster)
        try:
            if self._step_log_kv is None:
                self._step_log_kv = await sched.host.ctx.js.key_value(STEP_LOG_BUCKET)
            self.step_logs = await sync_step_logs(
                sched.host.ctx.js, self._step_log_kv, self.cluster, desired, self.step_logs
            )
        except Exception as exc:  # the bucket is made by `chamber setup`; jobs run without step logs meanwhile
            log.warning("could not hand out step logs", bucket=STEP_LOG_BUCKET, error=repr(exc))

    async def _delete_pod(self, action: DeletePod) -> None:
        """A preempted serving replica's pod goes (its controller makes it again, gated)."""
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(self.workloads.delete_pod, action.namespace, action.name)
        except ApiException as exc:
            if exc.status != 404:  # gone already is what we wanted
                log.warning("could not delete the pod", namespace=action.namespace, name=action.name, status=exc.status)
            return
        log.info("serving replica's pod deleted", namespace=action.namespace, name=action.name, reason=action.reason)

    async def apply_mig(self, now: float) -> None:
        """One step of the GPU Operator procedure on each node with a planned MIG change; `MigLayoutApplied`
        once the MIG manager reports success (a refused request waits a round)."""
        from kubernetes.client.exceptions import ApiException

        from services.scheduler.mig_apply import abandoned_nodes, applied_events, pending_changes

        sched, mig = self.scheduler, self.mig
        assert sched.host is not None and mig is not None
        for change in pending_changes(sched.state, self.cluster):
            try:
                step = await asyncio.to_thread(mig.step, change, now)
            except ApiException as exc:
                log.warning("MIG change: request refused", node=change.node, status=exc.status, reason=str(exc.reason))
                continue
            if step.done:
                for event, event_id in applied_events(self.cluster, change, now):
                    await sched.host.ctx.publisher.publish(event, id=event_id)
                log.info("MIG layout applied", node=change.node, config=change.config)
            elif step.wait:
                log.info("MIG change waits", node=change.node, config=change.config, why=step.wait)
        for name, when in abandoned_nodes(sched.state, self.cluster):
            if (name, when) in self.released:
                continue
            try:
                lifted = await asyncio.to_thread(mig.release, name)
            except ApiException as exc:
                log.warning("MIG change abandoned: uncordon refused", node=name, status=exc.status)
                continue
            self.released.add((name, when))
            if lifted:
                log.info("MIG change abandoned: cordon lifted", node=name)

    def _skipped(self, kind: Any) -> None:
        log.info("workload kind skipped: its CRD is not installed", kind=kind.kind, api_version=kind.api_version)

    async def tick(self, now: float) -> None:
        from kubernetes.client.exceptions import ApiException

        sched = self.scheduler
        if sched.host is None or not sched.ready or not sched.synced:
            return
        if not self.detected:
            await asyncio.to_thread(self.workloads.detect, self._skipped)
            self.detected = True
        listed = await asyncio.to_thread(self.workloads.list)
        rest, serving = split(listed)
        try:
            templates = await asyncio.to_thread(self.workloads.claim_templates, rest)
        except ApiException as exc:  # without them, pods asking through templates wait a round
            log.warning("could not list ResourceClaimTemplates", status=exc.status)
            templates = {}
        events, actions = reconcile(sched.state, rest, self.cluster, now, self.bindings, templates)
        more, scaled = reconcile_serving(sched.state, serving, self.cluster, now, self.bindings)
        events += more
        for event, event_id in events:
            await sched.host.ctx.publisher.publish(event, id=event_id)
        await self._hand_out_step_logs(listed)
        if self.mig is not None:
            await self.apply_mig(now)
        kinds = {k.kind: k for k in self.workloads.kinds}
        for action in [*actions, *scaled]:
            if isinstance(action, DeletePod):
                await self._delete_pod(action)
                continue
            if isinstance(action, Refuse):
                await refuse_once(
                    self.workloads, self.refused, kinds[action.kind], action, now, log, "kubernetes workload refused"
                )
                continue
            try:
                await asyncio.to_thread(
                    self.workloads.patch, kinds[action.kind], action.namespace, action.name, list(action.ops)
                )
            except ApiException as exc:  # one workload the API server refuses must not stall the others
                log.warning(
                    "kubernetes workload patch refused",
                    kind=action.kind,
                    namespace=action.namespace,
                    name=action.name,
                    status=exc.status,
                    reason=str(exc.reason),
                    body=str(exc.body)[:500],
                )
                continue
            log.info(
                "kubernetes workload updated",
                action=type(action).__name__,
                kind=action.kind,
                namespace=action.namespace,
                name=action.name,
            )
