"""One node's agent loop body: read the sampler, run the detectors, turn the results into records.

No I/O here: the shell passes `now`, and hands the records to the outbox. Message ids are node +
sequence (`<cluster>/<node>/<seq>`, faults and inventories suffixed), so JetStream drops a record
that is sent twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from events import subjects
from events.base import Event
from events.codec import (
    DEFAULT_MAX_BYTES,
    H_ID,
    H_MSG_ID,
    H_TIME,
    H_TRACEPARENT,
    ce_value,
    encode,
    encode_body,
    rfc3339,
)
from events.fabric import FabricSample
from events.streams import AGENT_TELEMETRY
from events.telemetry import GpuInfo, HostInfo, NodeInventory, NodeSample
from node_agent.detectors import DetectorState, GpuLimits, Reading, detect
from node_agent.fabric_detectors import FabricDetectorState, detect_nic
from node_agent.spool import Kind, Record
from node_agent.wire import WireForm, reduced
from services.runtime.tracing import root_traceparent

INVENTORY_EVERY_S = 60.0
INVENTORY_CHECK_S = 10.0
AGENT_VERSION = "0.1.0"
# The largest sample body the agent publishes: what its gate stream takes (events/streams.py).
MAX_SAMPLE_BYTES = min(AGENT_TELEMETRY.max_msg_size, DEFAULT_MAX_BYTES) - 4096  # headroom for the headers


class Sampler(Protocol):
    """What the agent reads on one node: NVML (`nvml_adapter.NvmlSampler`) or a simulated node."""

    def read(self, cluster: str, seq: int, now: float, interval_s: float) -> Reading: ...

    def inventory_gpus(self) -> list[GpuInfo]: ...

    def limits(self) -> Mapping[int, GpuLimits]: ...


class FabricReader(Protocol):
    """The node's NICs: `fabric_adapter.FabricAdapter` (sysfs) or a simulated node's `SimNicReader`."""

    def read(self, cluster: str, node: str, seq: int, now: float, interval_s: float) -> FabricSample | None: ...


@dataclass
class NodeFacts:
    driver_version: str | None = None
    cuda_version: str | None = None
    simulated: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    host: HostInfo | None = None  # the firmware's identity (dmi_adapter), read once at start
    cpu_milli: int | None = None  # the host's CPU and memory capacity (host_capacity), None: unknown
    memory_mib: int | None = None


class NodeRunner:
    def __init__(
        self,
        cluster: str,
        node: str,
        sampler: Sampler,
        facts: NodeFacts,
        *,
        seq: int = 0,
        source: str = "",
        fabric: FabricReader | None = None,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.sampler = sampler
        self.facts = facts
        self.seq = seq
        self.source = source or f"chamber/agent/{node}"
        self.detectors = DetectorState()
        self.fabric = fabric
        self.fabric_detectors = FabricDetectorState()
        self._fabric_subject = subjects.fabric(cluster, node)
        self._sample_subject = subjects.sample(cluster, node)
        self._fault_subject = subjects.faults(cluster, node)
        self._inventory_subject = subjects.inventory(cluster, node)
        self._inventory: list[GpuInfo] | None = None
        self._inventory_sent_at: float | None = None
        self._inventory_checked_at: float | None = None
        self.faults_found = 0
        self.wire = WireForm()
        self.samples_reduced = 0  # too big: sent without process lists and per-link counters
        self.samples_refused = 0  # too big even so: not sent (logged)
        self.refusals: list[str] = []  # why, for the shell to log (no I/O here)

    def tick(self, now: float, interval_s: float) -> list[Record]:
        """One interval: maybe the inventory, the sample, and the faults it shows."""
        out: list[Record] = []
        seq = self.seq
        self.seq += 1
        inv = self._inventory_due(now)
        if inv is not None:
            out.append(self._record(Kind.INVENTORY, self._inventory_subject, inv, f"{self._id(seq)}/inventory", now))
        reading = self.sampler.read(self.cluster, seq, now, interval_s)
        record = self._sample_record(reading.sample, seq, now)
        if record is not None:
            out.append(record)
        # The detectors read the full local sample, whatever went on the wire.
        self.detectors, faults = detect(self.detectors, reading, self.sampler.limits())
        if self.fabric is not None:
            fabric = self.fabric.read(self.cluster, self.node, seq, now, interval_s)
            if fabric is not None:
                out.append(self._record(Kind.SAMPLE, self._fabric_subject, fabric, f"{self._id(seq)}/fabric", now))
                faults = [*faults, *detect_nic(self.fabric_detectors, fabric)]
        for f in faults:
            out.append(self._record(Kind.FAULT, self._fault_subject, f, f.fault_id, now))
        self.faults_found += len(faults)
        return out

    def _sample_record(self, local: NodeSample, seq: int, now: float) -> Record | None:
        """The sample's wire form; cut down, or refused, when it would pass the message limit (the
        server would refuse it, or consumers dead-letter it)."""
        sample = self.wire(local)
        record = self._record(Kind.SAMPLE, self._sample_subject, sample, self._id(seq), now)
        if len(record.body) <= MAX_SAMPLE_BYTES:
            return record
        size = len(record.body)
        record = self._record(Kind.SAMPLE, self._sample_subject, reduced(sample), self._id(seq), now)
        if len(record.body) <= MAX_SAMPLE_BYTES:
            self.samples_reduced += 1
            self.refusals.append(
                f"sample {seq} was {size} bytes (limit {MAX_SAMPLE_BYTES}): sent without process lists "
                f"and per-link NVLink counters ({len(record.body)} bytes)"
            )
            return record
        self.samples_refused += 1
        self.wire.forget()  # what it carried did not go out
        self.refusals.append(
            f"sample {seq} not sent: {size} bytes, {len(record.body)} even without process lists and per-link "
            f"counters; the limit is {MAX_SAMPLE_BYTES}"
        )
        return None

    def _id(self, seq: int) -> str:
        return f"{self.cluster}/{self.node}/{seq}"

    def _record(self, kind: Kind, subject: str, event: Event, msg_id: str, now: float) -> Record:
        return Record(int(kind), subject, *envelope(event, self.source, msg_id, now))

    def _inventory_due(self, now: float) -> NodeInventory | None:
        checked = self._inventory_checked_at
        if checked is not None and now - checked < INVENTORY_CHECK_S:
            return None
        self._inventory_checked_at = now
        gpus = self.sampler.inventory_gpus()
        sent = self._inventory_sent_at
        if gpus == self._inventory and sent is not None and now - sent < INVENTORY_EVERY_S:
            return None
        self._inventory = gpus
        self._inventory_sent_at = now
        return NodeInventory(
            cluster=self.cluster,
            node=self.node,
            observed_at=now,
            gpus=gpus,
            driver_version=self.facts.driver_version,
            cuda_version=self.facts.cuda_version,
            agent_version=AGENT_VERSION,
            simulated=self.facts.simulated,
            labels=self.facts.labels,
            host=self.facts.host,
            cpu_milli=self.facts.cpu_milli,
            memory_mib=self.facts.memory_mib,
        )


_static_headers: dict[tuple[type[Event], str], dict[str, str]] = {}
_times: dict[float, str] = {}


def envelope(event: Event, source: str, msg_id: str, now: float) -> tuple[dict[str, str], bytes]:
    """What `events.codec.encode` gives (same headers, same body), with the parts that do not change
    per message cached: a fleet of 1,000 nodes encodes 1,000 of these per interval."""
    static = _static_headers.get((type(event), source))
    if static is None:
        headers, _ = encode(event, source=source, id="-", time=now)
        static = _static_headers[(type(event), source)] = {
            k: v for k, v in headers.items() if k not in (H_ID, H_TIME, H_MSG_ID)
        }
    when = _times.get(now)
    if when is None:
        if len(_times) > 64:
            _times.clear()
        when = _times[now] = rfc3339(now)
    msg_id = ce_value(msg_id)  # percent-encoded as the CloudEvents binding asks (a no-op for plain ids)
    headers = {**static, H_ID: msg_id, H_TIME: when, H_MSG_ID: msg_id}
    headers[H_TRACEPARENT] = root_traceparent()  # each sample starts its own trace (README: every event has one)
    return headers, encode_body(event)


class SeqStore:
    """The next sequence number of every node, kept beside the spool so that a restarted agent goes
    on where it stopped (a reused sequence would be dropped by JetStream as a duplicate)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.next: dict[str, int] = msgspec.json.decode(path.read_bytes(), type=dict[str, int])
        except (FileNotFoundError, msgspec.DecodeError):
            self.next = {}

    def get(self, node: str) -> int:
        return self.next.get(node, 0)

    def save(self, runners: list[NodeRunner]) -> None:
        for r in runners:
            self.next[r.node] = r.seq
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(self.next))
        tmp.replace(self.path)
