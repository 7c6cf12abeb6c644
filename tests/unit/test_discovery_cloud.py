"""Discovery records provider, region, zone and instance type from standard node labels and providerID."""

from __future__ import annotations

import pytest

from events import NodeDiscovered
from services.discovery.cloud import cloud_labels, provider_of
from services.discovery.core import KubeNode, KubeNodesListed, decide, evolve, new_state

T0 = 1_700_000_000.0


@pytest.mark.parametrize(
    "provider_id,provider",
    [
        ("aws:///us-east-1a/i-0abc123", "aws"),
        ("gce://my-project/us-central1-a/gke-pool-1", "gcp"),
        ("azure:///subscriptions/x/resourceGroups/y/providers/Microsoft.Compute/virtualMachines/z", "azure"),
        ("oci://ocid1.instance.oc1", "oci"),
        ("kind://docker/kind/kind-worker", "kind"),
        ("", "on-prem"),
        ("not-a-provider-id", "on-prem"),
    ],
)
def test_the_provider_comes_from_the_provider_id_scheme(provider_id: str, provider: str) -> None:
    assert provider_of(provider_id) == provider


def test_standard_and_legacy_topology_labels_are_read() -> None:
    assert cloud_labels(
        {
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "topology.kubernetes.io/region": "us-east-1",
            "failure-domain.beta.kubernetes.io/zone": "us-east-1a",
        },
        "aws:///us-east-1a/i-0abc",
    ) == {
        "chamber.io/provider": "aws",
        "chamber.io/instance-type": "p5.48xlarge",
        "chamber.io/region": "us-east-1",
        "chamber.io/zone": "us-east-1a",
    }
    assert cloud_labels({}, None) == {"chamber.io/provider": "on-prem"}


def test_a_discovered_cloud_node_carries_where_it_runs() -> None:
    node = KubeNode(
        name="ip-10-0-0-1",
        labels={"node.kubernetes.io/instance-type": "a3-highgpu-8g", "topology.kubernetes.io/region": "us-central1",
                "topology.kubernetes.io/zone": "us-central1-a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        capacity_gpus=8,
        allocatable_gpus=8,
        provider_id="gce://proj/us-central1-a/ip-10-0-0-1",
    )  # fmt: skip
    state = new_state()
    evolve(state, KubeNodesListed("c1", T0, (node,)))
    [found] = [e for e in decide(state, T0) if isinstance(e, NodeDiscovered)]
    assert {k: v for k, v in found.labels.items() if k.startswith("chamber.io/") and "gpu" not in k} == {
        "chamber.io/provider": "gcp",
        "chamber.io/region": "us-central1",
        "chamber.io/zone": "us-central1-a",
        "chamber.io/instance-type": "a3-highgpu-8g",
    }
