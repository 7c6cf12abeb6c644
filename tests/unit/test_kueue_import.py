"""`chamber quota import-kueue`: Kueue objects become quota commands the CLI accepts and namespace
bindings; what has no equivalent is refused with the reason."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import build_parser
from services.kube.bindings import Bindings
from services.kube.kueue_import import convert

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "kueue" / "queues.yaml"


def example() -> list[Any]:
    return list(yaml.safe_load_all(EXAMPLE.read_text()))


def test_the_documented_example_converts_whole_into_commands_the_cli_accepts() -> None:
    result = convert(example())
    assert result.refused == []
    assert result.commands == [
        "chamber quota pool set a100 --node-label nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB",
        "chamber quota pool set h100 --node-label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "chamber quota set nlp --pool h100 --gpus 32 --replace",
        "chamber quota set speech --pool a100 --gpus 16 --borrow-limit 0 --lend-limit 0 --replace",  # no cohort: alone
        "chamber quota set vision --pool h100 --gpus 32 --borrow-limit 16 --lend-limit 24 --weight 2 --replace",
    ]
    parser = build_parser()
    for command in result.commands:
        args = parser.parse_args(shlex.split(command)[1:])
        assert args.func is not None
    assert result.bindings["namespaces"]["ml-vision"] == {"teams": ["vision"], "queues": {"main": "vision"}}
    assert result.bindings["priorities"] == {"prod": "high", "sweep": "low"}


def test_the_bindings_load_as_the_scheduler_and_the_webhook_load_them(tmp_path: Path) -> None:
    path = tmp_path / "bindings.yaml"
    path.write_text(yaml.safe_dump(convert(example()).bindings))
    bindings = Bindings.load(path)
    assert bindings.namespaces["ml-nlp"].queues == {"main": "nlp"} and not bindings.open


def cq(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def flavor(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": labels}}  # fmt: skip


def gpus(flavor_name: str, n: Any, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    resources = [{"name": "nvidia.com/gpu", "nominalQuota": n}, *extra]
    return [
        {"coveredResources": [r["name"] for r in resources], "flavors": [{"name": flavor_name, "resources": resources}]}
    ]


@pytest.mark.parametrize(
    "docs,reason",
    [
        ([flavor("f"), cq("a", cohort="x", resourceGroups=gpus("f", 8)),
          cq("b", cohort="y", resourceGroups=gpus("f", 8))], "cohorts x and y share flavor f"),
        ([flavor("f", a="1", b="2"), cq("a", resourceGroups=gpus("f", 8))], "selects nodes by 2 labels"),
        ([flavor("f"), cq("a", queueingStrategy="StrictFIFO", resourceGroups=gpus("f", 8))], "StrictFIFO"),
        ([flavor("f"), cq("a", resourceGroups=gpus("f", 8, {"name": "cpu", "nominalQuota": 64}))],
         "quota of cpu is not carried over"),
        ([flavor("f"), cq("a", preemption={"reclaimWithinCohort": "Never"}, resourceGroups=gpus("f", 8))],
         "Chamber always reclaims"),
        ([flavor("f"), cq("a", preemption={"borrowWithinCohort": {"policy": "LowerPriority"}},
                          resourceGroups=gpus("f", 8))], "never preempts to borrow"),
        ([cq("a", resourceGroups=gpus("missing", 8))], "ResourceFlavor missing is not in the file"),
        ([flavor("f"), cq("Team_A", resourceGroups=gpus("f", 8))], "is not a team name"),
        ([flavor("f"), cq("a", resourceGroups=gpus("f", "1.5"))], "is not a whole number of GPUs"),
        ([{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Cohort", "metadata": {"name": "c"},
           "spec": {"parentName": "root"}}], "hierarchical cohorts"),
        ([{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck", "metadata": {"name": "p"}}],
         "no equivalent of a Kueue AdmissionCheck"),
        ([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}], "not a Kueue object"),
    ],
)  # fmt: skip
def test_what_has_no_equivalent_is_refused_with_the_reason(docs: list[Any], reason: str) -> None:
    refused = convert(docs).refused
    assert any(reason in r for r in refused), refused
