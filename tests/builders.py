"""Small builders so tests read as scenarios."""

from __future__ import annotations

from events import GpuSample, JobSpec, JobSubmitted, NodeSample


def a_job_submitted(job_id: str = "j1", *, team: str = "vision", gpus: int = 8, at: float = 1.0) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, at=at, spec=JobSpec(team=team, gpus_per_replica=gpus))


def a_node_sample(node: str = "n1", *, seq: int = 0, gpus: int = 8, cluster: str = "c1") -> NodeSample:
    """About the size of a real 8-GPU sample without processes (~3 KiB of JSON)."""
    return NodeSample(
        cluster=cluster,
        node=node,
        seq=seq,
        observed_at=1_700_000_000.0 + seq,
        interval_s=1.0,
        gpus=[
            GpuSample(
                index=i,
                uuid=f"GPU-{node}-{i:02d}-0000-0000-0000-000000000000",
                utilization_pct=87.0,
                memory_utilization_pct=41.0,
                memory_used_mib=61_440.0,
                memory_total_mib=81_559.0,
                power_w=612.5,
                power_limit_w=700.0,
                temperature_c=64.0,
                sm_clock_mhz=1980.0,
                mem_clock_mhz=2619.0,
                throttle_reasons=[],
                ecc_sbe_volatile=0,
                ecc_dbe_volatile=0,
                retired_pages_pending=False,
                pcie_replay_count=0,
            )
            for i in range(gpus)
        ],
    )
