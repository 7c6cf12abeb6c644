"""The fabric as agents see it (one FabricSample per node per interval, a companion of NodeSample on
its own subject) and the job-performance service's verdicts (JobSlowdownDetected / Cleared).

A companion sample rather than NodeSample fields: the GPU sample stays lean for the many consumers that
never look at NICs, and a node without readable NICs simply sends none. Rates are per second over the
interval; deltas are counts within the interval. A field the NIC or driver does not offer is None
("unknown"), never 0 ("none happened"). A counter that went backwards (wrap, driver reload) restarts
its rate: that interval's rate is None.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from events.base import Event, Name, event_type


class LinkState(StrEnum):
    UP = "up"  # IB ACTIVE / Ethernet operstate up
    DOWN = "down"
    INIT = "init"  # IB INIT / ARMED: trained, not yet carrying traffic
    UNKNOWN = "unknown"


class NicSample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One NIC port over one interval. `name` is `<dev>/<port>` for InfiniBand/RoCE, the interface for
    Ethernet; `index` is its position on the node (rail i serves GPU i on rail-optimised nodes)."""

    name: str
    index: int
    kind: str = "ib"  # ib | eth
    state: LinkState = LinkState.UNKNOWN
    rate_gbps: float | None = None
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    errors: int | None = None  # symbol, receive and CRC errors within the interval
    discards: int | None = None
    pause: int | None = None  # pause frames / xmit-wait ticks within the interval (PFC, congestion)
    flaps: int | None = None  # link down events / carrier changes within the interval
    gpu_index: int | None = None  # the GPU this NIC serves (rail), when known


class CommProgress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One NCCL communicator on this node as its RAS service reports it: collectives completed (all
    local ranks), and peers it lost. `job` is known where the job's label could be matched."""

    comm: str
    ops: int
    job: str | None = None
    ranks: int | None = None
    missing_ranks: int = 0
    # RAS queries in a row that returned the same collective counts (node_agent/ras_watch.py): 3 or
    # more while the communicator is RUNNING is a hang (NCCL's RAS guide: counts that do not change
    # across repeated queries mean the communicator is stuck).
    frozen_queries: int = 0
    status: str = ""  # RUNNING | INIT | FINALIZE | ABORT (RAS), "" when unknown
    errors: list[str] = []  # RAS's error words for the communicator: MISMATCH, INCOMPLETE, ERROR


class DeadPeer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An NCCL process NCCL's RAS declared dead (unreachable for 60 s), as RAS names it: the host is
    its address on the bootstrap network, `gpus` the CUDA devices it managed."""

    host: str
    pid: int | None = None
    gpus: list[int] = []
    seen_at: float = 0.0


class CollectiveBandwidth(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One NCCL Inspector series of one GPU on this node (its Prometheus textfile or OTLP export):
    bus bandwidth and execution time for one communicator, collective and message-size bucket."""

    gpu_index: int
    comm: str  # comm_name (or comm_id where Inspector gives it)
    collective: str  # AllReduce, AllGather, ... or Send / Recv for P2P
    message_size: str = ""  # Inspector's bucket, e.g. "4-5GB"
    busbw_gbs: float | None = None
    exec_time_us: float | None = None
    nranks: int | None = None


class FabricSample(Event, frozen=True, tag=event_type("telemetry", "fabric_sample")):
    """The node's NICs over one interval; `seq` follows the node's NodeSample sequence."""

    cluster: Name
    node: Name
    seq: int
    observed_at: float
    interval_s: float
    nics: list[NicSample]
    comms: list[CommProgress] = []
    labels: dict[str, str] = {}  # topology: rack, leaf, spine (when the agent knows them)
    dead_peers: list[DeadPeer] = []  # NCCL RAS: processes declared dead (on any node of the job)
    addresses: list[str] = []  # this node's IP addresses, so a dead peer's host maps to its node
    collectives: list[CollectiveBandwidth] = []  # NCCL Inspector: per communicator and collective


class CulpritKind(StrEnum):
    GPU = "gpu"
    NIC = "nic"
    FABRIC = "fabric"  # shared congestion (a leaf switch), not one node's fault
    UNKNOWN = "unknown"


class JobSlowdownDetected(Event, frozen=True, tag=event_type("perf", "job_slowdown_detected")):
    """A running multi-node job is slower than its own best, persistently, and (where signals diverge)
    who is to blame. `evidence` holds the numbers the verdict rests on."""

    job_id: Name
    episode: int  # 1, 2, ... per job: Cleared names the same episode
    at: float
    since: float
    culprit: CulpritKind
    score: float  # the job's speed against its own best (1.0 = as fast as ever)
    confidence: float
    cluster: str | None = None
    node: str | None = None
    gpu_index: int | None = None
    nic: str | None = None
    leaf: str | None = None
    evidence: dict[str, float | str] = {}
    reason: str = ""
    # Added with defaults (an old body decodes; an old subscriber ignores them): every GPU of the
    # culprit (a tensor-parallel worker is several), the global ranks it covers, and the pattern the
    # verdict rests on: slow_worker | stage_imbalance | data_imbalance | "" (per-GPU samples alone).
    # An imbalance is not a hardware fault: culprit `unknown`, the reason says what to change.
    gpu_indices: list[int] = []
    ranks: list[int] = []
    pattern: str = ""


class JobSlowdownCleared(Event, frozen=True, tag=event_type("perf", "job_slowdown_cleared")):
    job_id: Name
    episode: int
    at: float
    since: float
    reason: str = ""  # recovered | stopped
