"""The Kubernetes node actuator, with the real `kubernetes` client against a local API-server stub
that records the exact requests."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from events import GpuIsolated, GpuRestored, NodeIsolated, NodeRestored
from services.health.kube import KubeActuator, client_from, condition_reason, taint_value
from tests.kube_stub import KubeStub, Request, a_k8s_node

pytestmark = pytest.mark.integration

AT = 1_700_000_000.0
PATCH = "application/strategic-merge-patch+json"
REASON = "xid-79: GPU has fallen off the bus"


def isolated(node: str = "gpu-1") -> NodeIsolated:
    return NodeIsolated(cluster="c1", node=node, at=AT, reason=REASON, fault_ids=["f1"], until=AT + 3600)


def restored(node: str = "gpu-1") -> NodeRestored:
    return NodeRestored(cluster="c1", node=node, at=AT + 3600, reason="clean probation after: " + REASON)


def test_isolating_a_node_cordons_taints_and_sets_the_condition() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        KubeActuator(api.client()).apply(isolated())
        assert api.writes() == [
            Request(
                "PATCH",
                "/api/v1/nodes/gpu-1",
                PATCH,
                {
                    "metadata": {
                        "resourceVersion": "1",
                        "annotations": {"chamber.io/cordoned": "true", "chamber.io/isolation-reason": REASON},
                    },
                    "spec": {
                        "unschedulable": True,
                        "taints": [{"key": "chamber.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}],
                    },
                },
            ),
            Request(
                "PATCH",
                "/api/v1/nodes/gpu-1/status",
                PATCH,
                {
                    "status": {
                        "conditions": [
                            {
                                "type": "ChamberGPUHealthy",
                                "status": "False",
                                "reason": "Xid79",
                                "message": REASON,
                                "lastTransitionTime": "2023-11-14T22:13:20Z",
                                "lastHeartbeatTime": "2023-11-14T22:13:20Z",
                            }
                        ]
                    }
                },
            ),
        ]
        node = api.nodes["gpu-1"]
        assert node["spec"]["unschedulable"] is True
        assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "ChamberGPUHealthy"]


def test_restoring_undoes_what_chamber_did_and_isolating_twice_sends_nothing() -> None:
    with KubeStub([a_k8s_node("gpu-1", taints=[{"key": "team", "value": "a", "effect": "NoSchedule"}])]) as api:
        actuator = KubeActuator(api.client())
        actuator.apply(isolated())
        before = len(api.writes())
        assert actuator.apply(isolated()) == []  # idempotent: a replayed decision changes nothing
        assert len(api.writes()) == before
        actuator.apply(restored())
        uncordon, condition = api.writes()[-2:]
        assert uncordon.body == {
            "metadata": {
                "resourceVersion": "3",
                "annotations": {"chamber.io/cordoned": None, "chamber.io/isolation-reason": None},
            },
            "spec": {"unschedulable": False, "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}]},
        }
        assert condition.body["status"]["conditions"][0] | {"lastTransitionTime": "-", "lastHeartbeatTime": "-"} == {
            "type": "ChamberGPUHealthy",
            "status": "True",
            "reason": "Restored",
            "message": "clean probation after: " + REASON,
            "lastTransitionTime": "-",
            "lastHeartbeatTime": "-",
        }
        node = api.nodes["gpu-1"]
        assert node["spec"] == {
            "unschedulable": False,
            "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}],
        }
        assert node["metadata"]["annotations"] == {}


def test_a_node_cordoned_by_a_human_stays_cordoned_after_restore() -> None:
    with KubeStub([a_k8s_node("gpu-1", unschedulable=True)]) as api:
        actuator = KubeActuator(api.client())
        actuator.apply(isolated())
        first = api.writes()[0].body
        assert "unschedulable" not in first["spec"] and "chamber.io/cordoned" not in first["metadata"]["annotations"]
        actuator.apply(restored())
        undo = api.writes()[2].body
        assert undo["spec"] == {"taints": []} and "unschedulable" not in undo["spec"]
        assert api.nodes["gpu-1"]["spec"]["unschedulable"] is True


def test_gpu_isolation_lists_the_isolated_uuids_and_restore_removes_them() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        actuator = KubeActuator(api.client())
        for i, uuid in ((3, "GPU-bbb"), (1, "GPU-aaa")):
            actuator.apply(
                GpuIsolated(cluster="c1", node="gpu-1", gpu_index=i, at=AT, reason="ecc_dbe: DBE", gpu_uuid=uuid)
            )
        assert [w.body for w in api.writes()] == [
            {
                "metadata": {
                    "resourceVersion": "1",
                    "annotations": {"chamber.io/isolated-gpus": "GPU-bbb"},
                    "labels": {"chamber.io/isolated-gpu-count": "1"},
                }
            },
            {
                "metadata": {
                    "resourceVersion": "2",
                    "annotations": {"chamber.io/isolated-gpus": "GPU-aaa,GPU-bbb"},
                    "labels": {"chamber.io/isolated-gpu-count": "2"},
                }
            },
        ]
        assert {w.path for w in api.writes()} == {"/api/v1/nodes/gpu-1"}  # the node is not cordoned
        for i, uuid in ((3, "GPU-bbb"), (1, "GPU-aaa")):
            actuator.apply(GpuRestored(cluster="c1", node="gpu-1", gpu_index=i, at=AT, reason="ok", gpu_uuid=uuid))
        assert api.writes()[-1].body["metadata"]["annotations"] == {"chamber.io/isolated-gpus": None}
        meta = api.nodes["gpu-1"]["metadata"]
        assert (
            "chamber.io/isolated-gpus" not in meta["annotations"]
            and "chamber.io/isolated-gpu-count" not in meta["labels"]
        )


def test_a_concurrent_edit_is_refused_and_the_patch_recomputed() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        api.conflicts_to_inject = 1
        KubeActuator(api.client()).apply(isolated())
        statuses = [r.path for r in api.requests]
        assert statuses == ["/api/v1/nodes/gpu-1"] * 4 + ["/api/v1/nodes/gpu-1/status"]
        assert api.requests[3].body["metadata"]["resourceVersion"] == "2"  # re-read after the 409
        assert api.nodes["gpu-1"]["spec"]["unschedulable"] is True


def test_dry_run_reads_but_sends_no_patch() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        patches = KubeActuator(api.client(), dry_run=True).apply(isolated())
        assert [r.method for r in api.requests] == ["GET"]
        assert patches[0]["spec"]["unschedulable"] is True and len(patches) == 2


def test_a_node_unknown_to_kubernetes_is_skipped() -> None:
    with KubeStub([]) as api:
        assert KubeActuator(api.client()).apply(isolated("elsewhere")) == []


def test_the_client_loads_a_kubeconfig(tmp_path: Path) -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        core = client_from(str(api.kubeconfig(tmp_path / "kubeconfig")), in_cluster=False)
        assert core.read_node("gpu-1").metadata.name == "gpu-1"
        assert client_from(None, in_cluster=False) is None


@pytest.mark.parametrize(
    ("reason", "taint", "condition"),
    [
        ("xid-79: fell off", "xid-79", "Xid79"),
        ("ecc_dbe: Volatile DBE", "ecc_dbe", "EccDbe"),
        ("xid 48 (uncorrectable): DBE", "xid-48--uncorrectable", "Xid48Uncorrectable"),
        (": odd", "gpu-fault", "GpuFault"),
    ],
)
def test_taint_values_and_condition_reasons_are_valid_kubernetes_strings(
    reason: str, taint: str, condition: str
) -> None:
    assert taint_value(reason) == taint and condition_reason(reason) == condition


def test_a_live_gpu_decision_writes_the_full_list_without_a_read() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        actuator = KubeActuator(api.client())
        event = GpuIsolated(cluster="c1", node="gpu-1", gpu_index=3, at=AT, reason="ecc_dbe: DBE", gpu_uuid="GPU-bbb")
        actuator.apply(event, isolated_gpus=["GPU-bbb", "GPU-aaa"])
        assert api.requests == [
            Request(
                "PATCH",
                "/api/v1/nodes/gpu-1",
                PATCH,
                {
                    "metadata": {
                        "annotations": {"chamber.io/isolated-gpus": "GPU-aaa,GPU-bbb"},
                        "labels": {"chamber.io/isolated-gpu-count": "2"},
                    }
                },
            )
        ]
        restored = GpuRestored(cluster="c1", node="gpu-1", gpu_index=3, at=AT, reason="ok", gpu_uuid="GPU-bbb")
        actuator.apply(restored, isolated_gpus=[])
        meta = api.nodes["gpu-1"]["metadata"]
        assert (
            "chamber.io/isolated-gpus" not in meta["annotations"]
            and "chamber.io/isolated-gpu-count" not in meta["labels"]
        )
        assert (
            KubeActuator(api.client()).apply(
                GpuIsolated(cluster="c1", node="gone", gpu_index=0, at=AT, reason="x"), isolated_gpus=["index-0"]
            )
            == []
        )


def test_monitor_mode_means_report_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.health.kube import monitor_mode

    monkeypatch.setenv("CHAMBER_MODE", "monitor")
    assert monitor_mode()
    monkeypatch.setenv("CHAMBER_MODE", "manage")
    assert not monitor_mode()


def test_a_gpus_uuid_replaces_its_index_placeholder_so_one_gpu_is_one_entry() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        actuator = KubeActuator(api.client())
        unknown = GpuIsolated(cluster="c1", node="gpu-1", gpu_index=5, at=AT, reason="ecc_dbe: DBE")
        actuator.apply(unknown)
        assert api.nodes["gpu-1"]["metadata"]["annotations"]["chamber.io/isolated-gpus"] == "index-5"
        actuator.apply(with_uuid := replace(unknown, gpu_uuid="GPU-05"))  # the UUID is known now
        meta = api.nodes["gpu-1"]["metadata"]
        assert meta["annotations"]["chamber.io/isolated-gpus"] == "GPU-05"
        assert meta["labels"]["chamber.io/isolated-gpu-count"] == "1"
        writes = len(api.writes())
        assert actuator.apply(with_uuid) == [] and len(api.writes()) == writes  # nothing drifted
        actuator.apply(GpuRestored(cluster="c1", node="gpu-1", gpu_index=5, at=AT, reason="ok", gpu_uuid="GPU-05"))
        assert "chamber.io/isolated-gpus" not in api.nodes["gpu-1"]["metadata"]["annotations"]


def test_a_reconcile_writes_the_full_list_only_when_the_node_differs() -> None:
    with KubeStub([a_k8s_node("gpu-1")]) as api:
        actuator = KubeActuator(api.client())
        event = GpuIsolated(cluster="c1", node="gpu-1", gpu_index=5, at=AT, reason="ecc_dbe: DBE", gpu_uuid="GPU-05")
        actuator.apply(event, isolated_gpus=["index-5", "GPU-01"])  # written while GPU 5's UUID was unknown
        writes = len(api.writes())
        patches = actuator.apply(event, isolated_gpus=["GPU-05", "GPU-01"], read_first=True)
        assert [p["metadata"]["annotations"] for p in patches] == [{"chamber.io/isolated-gpus": "GPU-01,GPU-05"}]
        assert patches[0]["metadata"]["resourceVersion"]  # read first: a concurrent edit is refused (409)
        assert len(api.writes()) == writes + 1
        assert actuator.apply(event, isolated_gpus=["GPU-01", "GPU-05"], read_first=True) == []
        assert len(api.writes()) == writes + 1
