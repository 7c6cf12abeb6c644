"""Every read of the machine's firmware identity in one place: DMI/SMBIOS strings from
/sys/class/dmi/id, mapped to a cloud provider and, where the firmware names it, the instance type.

Root-free: sys_vendor, product_name, board_asset_tag and chassis_asset_tag are world-readable;
product_uuid is root-only on most kernels (mode 0400), so an unprivileged agent sends it as ''. The
sysfs root is a parameter, so tests run the adapter on a recorded tree they create.

What each cloud's firmware says (the vendors' documentation; cloud-init's ds-identify checks the same):
- Amazon EC2 (Nitro): sys_vendor "Amazon EC2", product_name the instance type ("p5.48xlarge"),
  board_asset_tag the instance id ("i-0af01c0123456789a"). Older Xen instances: sys_vendor "Xen",
  product_uuid starting "ec2" (only readable as root); no instance type there.
- Google Compute Engine: sys_vendor "Google", product_name "Google Compute Engine". The machine type
  ("a3-highgpu-8g") is not in the firmware: only the metadata server or the node label has it.
- Microsoft Azure: sys_vendor "Microsoft Corporation", product_name "Virtual Machine", and the chassis
  asset tag "7783-7084-3265-9085-8269-3286-77" that marks Azure. The VM size is not in the firmware.
- Oracle Cloud (OCI): chassis_asset_tag "OracleCloud.com". The shape is not in the firmware.
- Anything else: on-prem (bare metal or a private hypervisor); nothing readable at all: '' (unknown).

No network calls (no metadata servers): the agent runs everywhere, and a blocked link-local address
would stall its start. Region and zone come from the Kubernetes node labels (discovery).
"""

from __future__ import annotations

import re
from pathlib import Path

from events.telemetry import HostInfo

DMI_DIR = "sys/class/dmi/id"
FIELDS = ("sys_vendor", "product_name", "product_uuid", "board_asset_tag", "chassis_asset_tag")
AZURE_CHASSIS_TAG = "7783-7084-3265-9085-8269-3286-77"
OCI_CHASSIS_TAG = "OracleCloud.com"
ON_PREM = "on-prem"  # the same word discovery uses for a node without a providerID
_EC2_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")  # p5.48xlarge, g6e.xlarge, i3.metal
_EC2_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
MAX_FIELD = 128  # firmware strings are short; a longer one is not a name we map


def _text(path: Path) -> str:
    try:
        value = path.read_text(errors="replace").strip()
    except OSError:  # missing (containers, non-x86 boards) or root-only (product_uuid)
        return ""
    return value if len(value) <= MAX_FIELD and value.isprintable() else ""


def read_dmi(root: Path = Path("/")) -> dict[str, str]:
    """The raw DMI strings under `root` ('' for each one that is missing or unreadable)."""
    base = root / DMI_DIR
    return {name: _text(base / name) for name in FIELDS}


def identify(dmi: dict[str, str]) -> HostInfo:
    """Pure: the provider and instance type the firmware strings name."""
    if not any(dmi.values()):
        return HostInfo()  # nothing readable (a container without /sys/class/dmi, an ARM board): unknown
    vendor, product = dmi.get("sys_vendor", ""), dmi.get("product_name", "")
    uuid, board, chassis = dmi.get("product_uuid", ""), dmi.get("board_asset_tag", ""), dmi.get("chassis_asset_tag", "")
    provider, instance_type, instance_id = ON_PREM, "", ""
    if vendor == "Amazon EC2" or uuid.lower().startswith("ec2") or _EC2_INSTANCE_ID.match(board):
        provider = "aws"
        instance_type = product if _EC2_INSTANCE_TYPE.match(product) else ""
        instance_id = board if _EC2_INSTANCE_ID.match(board) else ""
    elif vendor == "Google" or product == "Google Compute Engine":
        provider = "gcp"
    elif chassis == AZURE_CHASSIS_TAG:
        provider = "azure"
    elif chassis == OCI_CHASSIS_TAG:
        provider = "oci"
    return HostInfo(
        provider=provider,
        instance_type=instance_type,
        instance_id=instance_id,
        sys_vendor=vendor,
        product_name=product,
        product_uuid=uuid,
        board_asset_tag=board,
        chassis_asset_tag=chassis,
    )


def read_host(root: Path = Path("/")) -> HostInfo:
    return identify(read_dmi(root))
