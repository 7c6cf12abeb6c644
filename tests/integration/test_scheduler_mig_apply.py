"""A planned MIG layout applied through the GPU Operator by the scheduler's actuator (services/scheduler/
mig_apply.py), with the real `kubernetes` client against the API-server stub (tests/kube_stub.py), which
records every request: the mig-parted entry in the ConfigMap, cordon, wait for the node's GPU pods,
label, wait for the MIG manager's success, uncordon, then MigLayoutApplied; a failure keeps the node
cordoned and says so once on the Node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.kube.mig_config import CONFIG_LABEL, CORDONED, STATE_LABEL
from services.scheduler.mig_apply import (
    CONFIG_KEY,
    DEFAULT_CONFIG_MAP,
    FAILED_REASON,
    MigApplier,
    abandoned_nodes,
    applied_events,
    pending_changes,
)
from tests.integration.test_deploy_chart import helm, named, render  # noqa: F401 (helm: the session fixture)
from tests.integration.test_deploy_chart_dispatch import granted, rbac_need
from tests.kube_stub import KubeStub, a_k8s_node
from tests.scheduler_builders import Driver, a_job
from tests.unit.test_mig_live import managed_fleet, mig, planned

pytestmark = pytest.mark.integration
NS, CM = DEFAULT_CONFIG_MAP.split("/")


def a_pod(name: str, node: str, resources: dict[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "x:1"}
    if resources:
        container["resources"] = {"limits": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeName": node, "containers": [container]},
        "status": {"phase": phase},
    }


@contextmanager
def a_cluster() -> Iterator[KubeStub]:
    node = a_k8s_node("n1", gpus=2)
    node["metadata"]["labels"].update({CONFIG_LABEL: "all-disabled", STATE_LABEL: "success"})
    with KubeStub([node]) as stub:
        stub.add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CM, "namespace": NS}, "data": {}})
        stub.add(a_pod("train", "n1", {"nvidia.com/gpu": "1"}))
        stub.add(a_pod("sidecar", "n1"))  # no GPU: not waited for
        stub.add(a_pod("elsewhere", "n2", {"nvidia.com/gpu": "1"}))
        yield stub


@pytest.fixture
def api() -> Iterator[KubeStub]:
    with a_cluster() as stub:
        yield stub


def planned_fleet() -> Driver:
    d = managed_fleet(("n1", 2))
    d.given(*(a_job(f"s{i}", gpus=1, share=mig("1g.10gb"), at=1 + i) for i in range(2)))
    d.cycle(now=10)
    assert len(planned(d)) == 1
    return d


def node_of(api: KubeStub) -> dict[str, Any]:
    return api.nodes["n1"]


def test_the_documented_procedure_with_the_real_client_then_the_jobs_run_in_the_new_instances(api: KubeStub) -> None:
    d = the_procedure(api)
    d.cycle(now=30)
    assert d.state_of("s0") == "running" and d.state_of("s1") == "running"


def the_procedure(api: KubeStub) -> Driver:
    d = planned_fleet()
    [change] = pending_changes(d.state, "c1")
    applier = MigApplier(api.client().api_client, DEFAULT_CONFIG_MAP)
    # 1. the entry is written and the node cordoned (by Chamber: annotated)
    step = applier.step(change, 20.0)
    configs = yaml.safe_load(api.get("v1", "ConfigMap", NS, CM)["data"][CONFIG_KEY])["mig-configs"]
    assert configs == {change.config: change.entry}
    devices = next(e for e in change.entry if e["mig-enabled"])["mig-devices"]
    assert set(devices) == {"1g.10gb"} and devices["1g.10gb"] >= 2  # the queue's, free slices filled
    assert node_of(api)["spec"]["unschedulable"] is True and node_of(api)["metadata"]["annotations"][CORDONED] == "true"
    # 2. a GPU pod still runs there: wait (the pod without GPUs and the other node's do not count)
    step = applier.step(change, 21.0)
    assert step.patch is None and "1 pods" in step.wait
    api.get("v1", "Pod", "ml", "train")["status"]["phase"] = "Succeeded"
    # 3. label set, the old state removed; 4. wait for the MIG manager
    applier.step(change, 22.0)
    assert node_of(api)["metadata"]["labels"][CONFIG_LABEL] == change.config
    assert STATE_LABEL not in node_of(api)["metadata"]["labels"]
    assert "applying" in applier.step(change, 23.0).wait
    node_of(api)["metadata"]["labels"][STATE_LABEL] = "success"  # what the MIG manager reports
    # 5. uncordon, then done
    applier.step(change, 24.0)
    assert node_of(api)["spec"]["unschedulable"] is False and CORDONED not in node_of(api)["metadata"]["annotations"]
    assert applier.step(change, 25.0).done
    # exactly these writes, in this order (reads: the ConfigMap, the node and its pods, each round)
    writes = [(r.method, r.path) for r in api.writes()]
    assert writes == [
        ("PATCH", f"/api/v1/namespaces/{NS}/configmaps/{CM}"),
        ("PATCH", "/api/v1/nodes/n1"),  # cordon
        ("PATCH", "/api/v1/nodes/n1"),  # label
        ("PATCH", "/api/v1/nodes/n1"),  # uncordon
    ]
    pods = [r for r in api.requests if r.path == "/api/v1/pods"]
    assert pods and all(r.query == "fieldSelector=spec.nodeName%3Dn1" for r in pods)
    # the scheduler folds what the actuator publishes, and the jobs run in the new instances
    d.given(*(e for e, _ in applied_events("c1", change, 25.0)))
    assert pending_changes(d.state, "c1") == []
    return d


def test_a_failure_leaves_the_node_cordoned_and_is_posted_once_on_the_node(api: KubeStub) -> None:
    the_failure(api)


def the_failure(api: KubeStub) -> tuple[Driver, MigApplier]:
    d = planned_fleet()
    [change] = pending_changes(d.state, "c1")
    applier = MigApplier(api.client().api_client, DEFAULT_CONFIG_MAP)
    api.get("v1", "Pod", "ml", "train")["status"]["phase"] = "Failed"
    applier.step(change, 20.0)  # cordon
    applier.step(change, 21.0)  # label
    node_of(api)["metadata"]["labels"][STATE_LABEL] = "failed"
    for at in (22.0, 23.0):
        step = applier.step(change, at)
        assert step.patch is None and not step.done and "stays cordoned" in step.wait
    assert node_of(api)["spec"]["unschedulable"] is True
    [event] = api.events
    assert (event["reason"], event["involvedObject"]["kind"], event["involvedObject"]["name"]) == (
        FAILED_REASON,
        "Node",
        "n1",
    )
    assert pending_changes(d.state, "c1") == [change]  # the scheduler keeps work off the node meanwhile
    return d, applier


def test_an_operator_abandons_a_failed_change_the_cordon_is_lifted_and_whole_gpu_work_runs(api: KubeStub) -> None:
    from events.commands import AbandonMigChange
    from services.runtime.commands import CommandRefused
    from services.scheduler.service import validate_mig_abandon

    d, applier = the_failure(api)
    accepted = validate_mig_abandon(d.state, AbandonMigChange(node="n1", cluster="c1", reason="mig-manager"), 30.0)
    [append] = accepted.appends
    d.given(append.event)
    assert pending_changes(d.state, "c1") == [] and abandoned_nodes(d.state, "c1") == [("n1", 30.0)]
    with pytest.raises(CommandRefused, match="no MIG change pending"):
        validate_mig_abandon(d.state, AbandonMigChange(node="n1", cluster="c1"), 31.0)
    assert applier.release("n1") is True  # Chamber's cordon, lifted; the label is the operator's
    node = node_of(api)
    assert node["spec"]["unschedulable"] is False and CORDONED not in node["metadata"]["annotations"]
    assert applier.release("n1") is False
    # the GPUs keep the layout last applied (whole GPUs here): whole-GPU work runs, no new plan this hour
    d.given(a_job("w", gpus=2, at=32.0))
    d.cycle(now=40)
    assert d.state_of("w") == "running" and pending_changes(d.state, "c1") == []


def test_the_charts_mig_rbac_is_exactly_what_the_procedure_calls(helm: Path) -> None:  # noqa: F811
    requests = []
    for run in (the_procedure, the_failure):
        with a_cluster() as stub:
            run(stub)
        requests += stub.requests
    needed = {n for r in requests if (n := rbac_need(r.method, f"{r.path}?{r.query}")) is not None}
    docs = render(helm, [], "mig.apply=true")
    roles = [
        r for r in docs if r["kind"] in ("Role", "ClusterRole") and r["metadata"]["name"] == "chamber-scheduler-mig"
    ]
    assert {(r["kind"], r["metadata"].get("namespace")) for r in roles} == {("ClusterRole", None), ("Role", NS)}
    assert set().union(*(granted(r) for r in roles)) == needed
    [role] = [r for r in roles if r["kind"] == "Role"]  # the ConfigMap alone, by name
    assert [rule["resourceNames"] for rule in role["rules"]] == [[CM]]
    assert {r.path for r in requests if "/configmaps" in r.path} == {f"/api/v1/namespaces/{NS}/configmaps/{CM}"}
    env = {
        e["name"]: e.get("value")
        for e in named(docs, "Deployment", "chamber-scheduler")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["CHAMBER_MIG_CONFIG_MAP"] == DEFAULT_CONFIG_MAP
    assert yaml.safe_load(named(docs, "ConfigMap", CM)["data"][CONFIG_KEY])["mig-configs"]["all-disabled"]
    # off by default: test_deploy_chart's exact table of the default install's rules has none of these


async def test_the_scheduler_service_plans_and_its_actuator_applies_through_the_operator(tmp_path: Path) -> None:
    """End to end through `KubernetesActuator.apply_mig`: `chamber service scheduler --kubernetes-cluster
    c1=KUBECONFIG --mig-config-map ...` plans a layout for queued MIG jobs, its actuator writes the entry,
    cordons, labels, and once the MIG manager says success uncordons and publishes MigLayoutApplied,
    which the scheduler folds and starts the jobs in the new instances."""
    import argparse
    import asyncio

    from events import JobScheduled
    from events.codec import decode_event
    from services.cli.common import add_nats_option
    from services.runtime import Publisher, connect
    from services.scheduler import service as scheduler
    from tests.integration.test_dispatch_clusters import until
    from tests.secured_bus import SecuredNatsServer

    bus = SecuredNatsServer(tmp_path)
    bus.start()
    try:
        with a_cluster() as api:
            api.get("v1", "Pod", "ml", "train")["status"]["phase"] = "Succeeded"  # the node's GPU pod is done
            nc = await connect(bus.url, name="test-admin")
            publisher = Publisher(nc.jetstream(), source="test")
            fleet = managed_fleet(("n1", 2)).log  # the quota, and the node as discovery says
            for event in (*fleet, *(a_job(f"s{i}", gpus=1, share=mig("1g.10gb")) for i in (0, 1))):
                await publisher.publish(event)
            parser = argparse.ArgumentParser()
            add_nats_option(parser)
            scheduler.add_arguments(parser)
            config = api.kubeconfig(tmp_path / "c1.json")
            argv = ["--nats", bus.url_for("scheduler"), "--cluster", "home", "--kubernetes-cluster", f"c1={config}"]
            argv += ["--mig-config-map", DEFAULT_CONFIG_MAP, "--interval", "0.2", "--kubernetes-interval", "0.2"]
            stop = asyncio.Event()
            scheduling = asyncio.create_task(scheduler.run(parser.parse_args(argv), stop))
            try:
                labels = node_of(api)["metadata"]["labels"]
                await until(lambda: labels.get(CONFIG_LABEL, "all-disabled") != "all-disabled", within=30)
                assert node_of(api)["spec"]["unschedulable"] is True  # cordoned for the change
                configs = yaml.safe_load(api.get("v1", "ConfigMap", NS, CM)["data"][CONFIG_KEY])["mig-configs"]
                entry = configs[labels[CONFIG_LABEL]]
                devices = next(e for e in entry if e["mig-enabled"])["mig-devices"]
                assert set(devices) == {"1g.10gb"} and devices["1g.10gb"] >= 2
                labels[STATE_LABEL] = "success"  # what the MIG manager reports
                await until(lambda: node_of(api)["spec"]["unschedulable"] is False, within=5)

                async def scheduled(job_id: str) -> JobScheduled | None:
                    try:
                        msg = await nc.jetstream().get_last_msg("JOBS", f"chamber.jobs.{job_id}")
                    except Exception:
                        return None
                    event = decode_event(msg.headers, msg.data or b"")[0]
                    return event if isinstance(event, JobScheduled) else None

                for jid in ("s0", "s1"):
                    for _ in range(50):
                        if (found := await scheduled(jid)) is not None:
                            break
                        await asyncio.sleep(0.1)
                    assert found is not None, f"{jid} was not started in the applied layout"
                    [p] = found.placements
                    assert (p.node, p.mig_profile) == ("n1", "1g.10gb")
            finally:
                stop.set()
                await asyncio.wait_for(scheduling, 10)
                await nc.close()
    finally:
        bus.kill()
    assert bus.violations() == []
