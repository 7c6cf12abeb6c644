"""Applying a MIG layout through the GPU Operator's `nvidia.com/mig.config` label: the mig-parted entry,
and the cordon -> wait -> label -> wait for success -> uncordon procedure, one level-triggered step at a
time on node objects shaped as the API server returns them."""

from __future__ import annotations

from typing import Any

from services.kube.mig_config import CONFIG_LABEL, CORDONED, STATE_LABEL, Step, config_entry, config_name, next_step


def test_the_entry_counts_profiles_per_gpu() -> None:
    entry = config_entry({1: [("1g.10gb", 4), ("1g.10gb", 5), ("4g.40gb", 0)], 0: None})
    assert entry == [
        {"devices": [0], "mig-enabled": False},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "4g.40gb": 1}},
    ]
    assert config_name(entry) == config_name(list(entry)) and config_name(entry).startswith("chamber-")


def node(labels: dict[str, str] | None = None, cordoned: bool = False, ours: bool = False) -> dict[str, Any]:
    annotations = {CORDONED: "true"} if ours else {}
    return {
        "metadata": {"name": "gpu-1", "labels": labels or {}, "annotations": annotations},
        "spec": {"unschedulable": True} if cordoned else {},
    }


def apply(obj: dict[str, Any], step: Step) -> dict[str, Any]:
    """A strategic merge of the patch, as the API server would do it (None removes a key)."""
    assert step.patch is not None
    for part in ("metadata", "spec"):
        for key, value in step.patch.get(part, {}).items():
            if isinstance(value, dict):
                target = obj[part].setdefault(key, {})
                for k, v in value.items():
                    target.pop(k, None) if v is None else target.__setitem__(k, v)
            else:
                obj[part][key] = value
    return obj


def test_the_documented_procedure_step_by_step() -> None:
    want, obj = "chamber-abc", node({CONFIG_LABEL: "all-disabled", STATE_LABEL: "success"})
    obj = apply(obj, next_step(obj, want, busy_pods=2))
    assert obj["spec"]["unschedulable"] and obj["metadata"]["annotations"][CORDONED] == "true"
    assert "2 pods" in next_step(obj, want, busy_pods=2).wait
    obj = apply(obj, next_step(obj, want, busy_pods=0))
    assert obj["metadata"]["labels"][CONFIG_LABEL] == want
    obj["metadata"]["labels"][STATE_LABEL] = "pending"
    assert "applying" in next_step(obj, want, 0).wait
    obj["metadata"]["labels"][STATE_LABEL] = "success"
    obj = apply(obj, next_step(obj, want, 0))
    assert obj["spec"]["unschedulable"] is False and CORDONED not in obj["metadata"]["annotations"]
    assert next_step(obj, want, 0).done


def test_a_cordon_chamber_did_not_make_stays_and_a_failure_waits_for_an_operator() -> None:
    mine = node({CONFIG_LABEL: "chamber-abc", STATE_LABEL: "success"}, cordoned=True)
    assert next_step(mine, "chamber-abc", 0).done, "a human's cordon is left alone"
    failed = node({CONFIG_LABEL: "chamber-abc", STATE_LABEL: "failed"}, cordoned=True, ours=True)
    step = next_step(failed, "chamber-abc", 0)
    assert step.patch is None and "failed" in step.wait
