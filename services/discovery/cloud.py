"""Where a node runs and what it is, from the standard Kubernetes node labels and its providerID.

Kubernetes' cloud providers set `node.kubernetes.io/instance-type`, `topology.kubernetes.io/region`
and `topology.kubernetes.io/zone` (older clusters the `beta.` / `failure-domain.beta.` spellings),
and `spec.providerID` as `<provider>://<id>`. Discovery folds them into four labels billing and the
reports read, whatever the cloud: `chamber.io/provider` (`on-prem` without a providerID),
`chamber.io/region`, `chamber.io/zone`, `chamber.io/instance-type`.
"""

from __future__ import annotations

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


def cloud_labels(labels: dict[str, str], provider_id: str | None) -> dict[str, str]:
    """The four `chamber.io/` labels (those the node does not say are left out; provider always set)."""
    out = {PROVIDER: provider_of(provider_id)}
    for target, sources in _SOURCES.items():
        value = next((labels[s] for s in sources if labels.get(s)), None)
        if value:
            out[target] = value
    return out
