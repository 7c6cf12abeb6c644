"""Read-only views of the perf state for `chamber fabric` (per node: NICs, state, rate, error/pause
rates, flagged links). Pure: the state goes in, JSON-ready dicts come out."""

from __future__ import annotations

from statistics import median

from events.fabric import LinkState
from services.perf.core import FLAP_MEMORY_S, NIC_RATE_RATIO, PerfState


def fabric_view(state: PerfState) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for (cluster, node), v in sorted(state.nodes.items()):
        if not v.nics:
            continue
        rates = [n.rate_gbps for n in v.nics.values() if n.rate_gbps]
        typical = median(rates) if rates else None
        nics = []
        for rail, n in sorted(v.nics.items()):
            flags = []
            if n.state is LinkState.DOWN:
                flags.append("down")
            if (last := v.flaps.get(rail)) is not None and v.fabric_t - last <= FLAP_MEMORY_S:
                flags.append("flapping")
            if n.rate_gbps and typical and n.rate_gbps < NIC_RATE_RATIO * typical:
                flags.append("downshift")
            errs = v.errors.get(rail)
            if errs and sum(c for _, c in errs) > 0:
                flags.append("errors")
            nics.append(
                {
                    "nic": n.name,
                    "gpu": n.gpu_index,
                    "state": n.state.value,
                    "rate_gbps": n.rate_gbps,
                    "tx_gbps": None if n.tx_bytes_per_s is None else round(n.tx_bytes_per_s * 8 / 1e9, 2),
                    "rx_gbps": None if n.rx_bytes_per_s is None else round(n.rx_bytes_per_s * 8 / 1e9, 2),
                    "errors": n.errors,
                    "pause": n.pause,
                    "flaps": n.flaps,
                    "flags": flags,
                }
            )
        out.append(
            {
                "cluster": cluster,
                "node": node,
                "leaf": v.labels.get("leaf"),
                "rack": v.labels.get("rack"),
                "observed_at": v.fabric_t,
                "pause_per_nic_s": round(v.pause_per_nic_s, 1),
                "flagged": sum(1 for n in nics if n["flags"]),
                "nics": nics,
            }
        )
    return out
