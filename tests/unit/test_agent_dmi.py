"""The agent names its machine from the firmware (DMI under a recorded sysfs tree the tests create), the
inventory carries it, and discovery merges it with the node's labels (labels win where both speak)."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import NodeDiscovered, NodeInventory, decode
from events.telemetry import GpuInfo, HostInfo
from node_agent.agent import Agent, AgentOptions
from node_agent.dmi_adapter import read_dmi, read_host
from node_agent.spool import Kind
from services.discovery.core import KubeNode, KubeNodesListed, decide, evolve, new_state
from tests.unit.fake_pynvml import FakeNvml

T0 = 1_700_000_000.0
AZURE_TAG = "7783-7084-3265-9085-8269-3286-77"


def a_dmi_tree(root: Path, **fields: str) -> Path:
    """/sys/class/dmi/id as the kernel writes it: one file per string, newline-terminated."""
    base = root / "sys/class/dmi/id"
    base.mkdir(parents=True, exist_ok=True)
    for name, value in fields.items():
        (base / name).write_text(value + "\n")
    return root


EC2_NITRO = {
    "sys_vendor": "Amazon EC2",
    "product_name": "p5.48xlarge",
    "board_asset_tag": "i-0af01c0123456789a",
    "chassis_asset_tag": "Amazon EC2",
}


@pytest.mark.parametrize(
    "fields,provider,instance_type,instance_id",
    [
        (EC2_NITRO, "aws", "p5.48xlarge", "i-0af01c0123456789a"),
        ({"sys_vendor": "Xen", "product_name": "HVM domU", "product_uuid": "ec2e1916-9099-7caf-fd21-012345abcdef"},
         "aws", "", ""),
        ({"sys_vendor": "Google", "product_name": "Google Compute Engine", "product_uuid": "7d1b1c3e-..."},
         "gcp", "", ""),
        ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine", "chassis_asset_tag": AZURE_TAG},
         "azure", "", ""),
        ({"sys_vendor": "QEMU", "product_name": "Standard PC", "chassis_asset_tag": "OracleCloud.com"},
         "oci", "", ""),
        ({"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR", "board_asset_tag": "Default string"},
         "on-prem", "", ""),
        ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine", "chassis_asset_tag": "None"},
         "on-prem", "", ""),  # Hyper-V in a private data centre: no Azure chassis tag
    ],
)  # fmt: skip
def test_the_firmware_names_the_provider_and_where_it_can_the_instance_type(
    tmp_path: Path, fields: dict[str, str], provider: str, instance_type: str, instance_id: str
) -> None:
    host = read_host(a_dmi_tree(tmp_path, **fields))
    assert (host.provider, host.instance_type, host.instance_id) == (provider, instance_type, instance_id)
    assert host.sys_vendor == fields["sys_vendor"]  # the raw strings travel too


def test_a_machine_without_dmi_is_unknown_and_unreadable_fields_never_fail(tmp_path: Path) -> None:
    assert read_dmi(tmp_path) == dict.fromkeys(read_dmi(tmp_path), "")  # no /sys/class/dmi (a container, ARM)
    assert read_host(tmp_path) == HostInfo()  # unknown, not a guess
    root = a_dmi_tree(tmp_path / "odd", sys_vendor="Amazon EC2", product_name="x" * 500)
    (root / "sys/class/dmi/id/product_uuid").mkdir()  # unreadable as a file, like a root-only one to an agent
    host = read_host(root)
    assert (host.provider, host.instance_type, host.product_name, host.product_uuid) == ("aws", "", "", "")


def test_the_agents_inventory_carries_the_firmware_identity(tmp_path: Path) -> None:
    root = a_dmi_tree(tmp_path / "sysfs", **EC2_NITRO)
    opts = AgentOptions(nats="nats://127.0.0.1:1", cluster="c1", node="gpu-1", spool_dir=tmp_path / "spool",
                        sysfs_root=root)  # fmt: skip
    agent = Agent(opts, nvml=FakeNvml(gpus=2))
    try:
        [record] = [r for r in agent.collect(T0) if r.kind == Kind.INVENTORY]
    finally:
        agent._nvml.close()
    inventory = decode(record.headers, record.body).event
    assert isinstance(inventory, NodeInventory) and len(inventory.gpus) == 2
    assert inventory.host is not None
    assert (inventory.host.provider, inventory.host.instance_type) == ("aws", "p5.48xlarge")


def inventory(host: HostInfo | None, node: str = "n1") -> NodeInventory:
    gpus = [GpuInfo(index=0, uuid="GPU-0", model="H100-80GB")]
    return NodeInventory(cluster="c1", node=node, observed_at=T0, gpus=gpus, host=host)


def cloud(event: NodeDiscovered) -> dict[str, str]:
    keys = ("chamber.io/provider", "chamber.io/region", "chamber.io/zone", "chamber.io/instance-type")
    return {k: event.labels[k] for k in keys if k in event.labels}


def discovered(*items: object) -> NodeDiscovered:
    state = new_state()
    for item in items:
        evolve(state, item)
    [found] = [e for e in decide(state, T0 + 1) if isinstance(e, NodeDiscovered)]
    return found


EC2_HOST = HostInfo(provider="aws", instance_type="p5.48xlarge", sys_vendor="Amazon EC2")


def test_an_agent_outside_kubernetes_is_placed_by_its_firmware() -> None:
    assert cloud(discovered(inventory(EC2_HOST))) == {
        "chamber.io/provider": "aws",
        "chamber.io/instance-type": "p5.48xlarge",
    }
    assert cloud(discovered(inventory(None))) == {}  # nobody said anything: no guess


def test_the_firmware_fills_what_the_node_labels_leave_out() -> None:
    """A self-managed cluster on EC2: no providerID, no instance-type label, a region label."""
    node = KubeNode(name="n1", labels={"topology.kubernetes.io/region": "us-east-1"}, capacity_gpus=1)
    assert cloud(discovered(inventory(EC2_HOST), KubeNodesListed("c1", T0, (node,)))) == {
        "chamber.io/provider": "aws",
        "chamber.io/region": "us-east-1",
        "chamber.io/instance-type": "p5.48xlarge",
    }


def test_the_node_labels_win_where_both_speak() -> None:
    """The operator relabelled the node (a reserved-capacity type); the providerID names the cloud."""
    node = KubeNode(
        name="n1",
        labels={"node.kubernetes.io/instance-type": "p5.48xlarge-reserved"},
        capacity_gpus=1,
        provider_id="gce://proj/us-central1-a/n1",
    )
    assert cloud(discovered(inventory(EC2_HOST), KubeNodesListed("c1", T0, (node,)))) == {
        "chamber.io/provider": "gcp",
        "chamber.io/instance-type": "p5.48xlarge-reserved",
    }


def test_a_changed_firmware_identity_is_told_to_fleet() -> None:
    state = new_state()
    evolve(state, inventory(None))
    for event in decide(state, T0 + 1):
        evolve(state, event)
    evolve(state, NodeInventory(cluster="c1", node="n1", observed_at=T0 + 2, gpus=inventory(None).gpus, host=EC2_HOST))
    [updated] = decide(state, T0 + 3)
    assert "labels" in updated.changes and updated.labels["chamber.io/provider"] == "aws"  # type: ignore[attr-defined]


def test_billing_prices_a_node_by_the_instance_type_its_firmware_names() -> None:
    """Agent inventory -> discovery's FLEET event -> billing: the p5.48xlarge price, not the H100 model's."""
    from events import PriceSet
    from services.billing.core import BillingState, price_of
    from services.billing.core import evolve as bill

    state = BillingState()
    bill(state, PriceSet(gpu_model="H100-80GB", at=T0, price_per_gpu_hour=3.0), "p1")
    bill(state, PriceSet(gpu_model="", at=T0, price_per_gpu_hour=12.29, instance_type="p5.48xlarge"), "p2")
    bill(state, discovered(inventory(EC2_HOST)), "d1")
    assert price_of(state, ("c1", "n1", 0)) == 12.29
    bill(state, discovered(inventory(None, node="n2")), "d2")
    assert price_of(state, ("c1", "n2", 0)) == 3.0  # no firmware word: the model's price
