"""Where a node runs and what it is, from the standard Kubernetes node labels and its providerID.

Kubernetes' cloud providers set `node.kubernetes.io/instance-type`, `topology.kubernetes.io/region`
and `topology.kubernetes.io/zone` (older clusters the `beta.` / `failure-domain.beta.` spellings),
and `spec.providerID` as `<provider>://<id>`. Discovery folds them into four labels billing and the
reports read, whatever the cloud: `chamber.io/provider` (`on-prem` without a providerID),
`chamber.io/region`, `chamber.io/zone`, `chamber.io/instance-type`; the agent's firmware inventory
(`NodeInventory.host`) fills the provider and instance type where the node's labels are silent.
"""

from __future__ import annotations

from events.telemetry import HostInfo

PROVIDER = "chamber.io/provider"
REGION = "chamber.io/region"
ZONE = "chamber.io/zone"
INSTANCE_TYPE = "chamber.io/instance-type"
ON_PREM = "on-prem"

_SOURCES = {
    INSTANCE_TYPE: ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"),
    REGION: ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region"),
    ZONE: ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"),
}
# providerID schemes as the cloud controller managers write them -> the name reports use
_SCHEMES = {"gce": "gcp", "azure": "azure", "aws": "aws", "oci": "oci", "ibm": "ibm", "alicloud": "alibaba"}


def provider_of(provider_id: str | None) -> str:
    scheme, sep, _ = (provider_id or "").partition("://")
    if not sep or not scheme:
        return ON_PREM
    return _SCHEMES.get(scheme.lower(), scheme.lower())


def cloud_labels(labels: dict[str, str], provider_id: str | None, host: HostInfo | None = None) -> dict[str, str]:
    """The four `chamber.io/` labels (those nobody says are left out; provider always set).

    `host` is what the agent read from the machine's firmware (node_agent/dmi_adapter.py). Where the
    node's labels (or providerID) and the firmware both say something, the labels win: the cloud
    controller manager writes them from the cloud's API, they are the only source of region, zone and
    the GCE / Azure / OCI machine types, and an operator may relabel a node on purpose. The firmware
    fills what the labels leave out: the provider of a node without a providerID (a self-managed
    cluster on EC2, an agent outside Kubernetes), and EC2's instance type.
    """
    out = {PROVIDER: provider_of(provider_id)}
    if out[PROVIDER] == ON_PREM and host is not None and host.provider:
        out[PROVIDER] = host.provider
    for target, sources in _SOURCES.items():
        value = next((labels[s] for s in sources if labels.get(s)), None)
        if value:
            out[target] = value
    if INSTANCE_TYPE not in out and host is not None and host.instance_type:
        out[INSTANCE_TYPE] = host.instance_type
    return out


def host_labels(host: HostInfo | None) -> dict[str, str]:
    """The labels of a node Kubernetes does not list (an agent alone): the firmware's word only."""
    return {} if host is None else cloud_labels({}, None, host)
