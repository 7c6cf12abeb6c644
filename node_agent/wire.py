"""What a node's samples look like on the wire: compact, with the slow fields only when they change
and the per-link NVLink counters once a minute (their per-GPU totals every interval).

Pure and per node: `WireForm` holds what the node last sent (the slow fields of its last full sample,
and each GPU's last NVLink list with its compact form) and turns each local reading into the sample to
publish. The detectors keep reading the full local sample; only the published copy is compacted, so
nothing that isolates a GPU is lost to compaction.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import msgspec

from events.codec import encode_body as _encode
from events.telemetry import (
    SLOW_FIELDS,
    AmdGpuHealth,
    GpuSample,
    NodeSample,
    NvLinkCounters,
    NvLinkTotals,
    compact_links,
)

# A sample that carries the slow fields is sent at least this often, so a consumer that starts late (or
# missed one) knows them within a minute; a change is sent at once.
FULL_EVERY_S = 60.0

_slow = attrgetter("index", "uuid", *SLOW_FIELDS)
_OMITTED = dict.fromkeys(SLOW_FIELDS)  # None is each slow field's default: left out of the JSON


def omit_slow(g: GpuSample) -> GpuSample:
    """The GPU's sample with every slow field at its default (`replace(g, **_OMITTED)`): keywords
    written out are half the cost of a dict unpacked into them, eight GPUs a sample (64 partitions on
    a node in CPX mode). A test holds it to SLOW_FIELDS."""
    return msgspec.structs.replace(
        g,
        amd=None,
        memory_total_mib=None,
        power_limit_w=None,
        mem_clock_mhz=None,
        ecc_sbe_volatile=None,
        ecc_dbe_volatile=None,
        retired_pages_sbe=None,
        retired_pages_dbe=None,
        retired_pages_pending=None,
        row_remap=None,
        pcie_replay_count=None,
    )


class WireForm:
    """Turns one node's local readings into the samples it publishes, one call per interval."""

    def __init__(self, full_every_s: float = FULL_EVERY_S) -> None:
        self.full_every_s = full_every_s
        self._slow: list[tuple[Any, ...]] | None = None  # per GPU, as in the last full sample
        self._full_at: float | None = None
        self._links_at: float | None = None
        # GPU index -> (the local link list last seen, its compact form and totals): the simulator (and a
        # quiet GPU) hands the same list again, so compacting it again would be wasted work.
        self._links: dict[int, tuple[list[NvLinkCounters], list[NvLinkCounters], NvLinkTotals | None]] = {}
        self._amd: dict[int, tuple[AmdGpuHealth, msgspec.Raw]] = {}  # GPU index -> its health and its JSON
        self.full_samples = 0
        self.slow_omitted_samples = 0

    def __call__(self, sample: NodeSample) -> NodeSample:
        now = sample.observed_at
        slow = [_slow(g) for g in sample.gpus]
        full = slow != self._slow or self._due(self._full_at, now)
        if full:
            self._slow, self._full_at = slow, now
            self.full_samples += 1
        else:
            self.slow_omitted_samples += 1
        # Per-link counters ride once a minute whatever they do (the totals go every interval): a link
        # storm on every link would otherwise make every sample six times bigger.
        links = self._due(self._links_at, now)
        if links:
            self._links_at = now
        gpus = [self._gpu(g, full, links) for g in sample.gpus]
        return msgspec.structs.replace(sample, gpus=gpus, slow_omitted=not full, nvlink_omitted=not links)

    def forget(self) -> None:
        """The last sample never went out: the next one carries everything again."""
        self._slow = self._full_at = self._links_at = None

    def _due(self, last: float | None, now: float) -> bool:
        # now < last: the clock went back, start over
        return last is None or now - last >= self.full_every_s or now < last

    def _gpu(self, g: GpuSample, full: bool, with_links: bool) -> GpuSample:
        links = g.nvlink
        if not links:  # no NVLink counters (AMD, or none read): nothing to compact
            amd = g.amd
            if amd is None:
                return g if full else omit_slow(g)
            if not full:
                return omit_slow(g)  # its health is a slow field: unchanged since the last full sample
            # An AMD GPU's health (RAS blocks, bad pages, XGMI) is the same object while nothing in it
            # changes (the sampler keeps it): its JSON is made once, and goes out as those bytes
            # (msgspec.Raw, encoded verbatim: the body is byte for byte the same). The published copy
            # is only ever encoded.
            known = self._amd.get(g.index)
            if known is None or known[0] is not amd:
                known = self._amd[g.index] = (amd, msgspec.Raw(_encode(amd)))  # type: ignore[arg-type]
            return msgspec.structs.replace(g, amd=known[1])
        changes: dict[str, Any] = {} if full else dict(_OMITTED)
        if links:
            seen = self._links.get(g.index)
            if seen is not None and seen[0] is links:
                kept, total = seen[1], seen[2]
            else:
                compacted = compact_links(g)
                kept, total = compacted.nvlink, compacted.nvlink_total
                self._links[g.index] = (links, kept, total)
            changes["nvlink"] = kept if with_links else []
            changes["nvlink_total"] = total
        return msgspec.structs.replace(g, **changes) if changes else g


def reduced(sample: NodeSample) -> NodeSample:
    """A sample cut down to fit a message limit: no process lists and no per-link NVLink counters (the
    per-GPU totals stay). Used only when the full wire form is too big; the agent counts and logs it."""
    return msgspec.structs.replace(
        sample,
        gpus=[msgspec.structs.replace(g, processes=[], nvlink=[]) for g in sample.gpus],
        nvlink_omitted=True,  # the links are not "all zero", only not here
    )


def _full(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        out = {f: _full(getattr(value, f)) for f in value.__struct_fields__ if f not in _NEW_FIELDS}
        tag = value.__struct_config__.tag
        return {"type": tag, **out} if isinstance(tag, str) else out
    if isinstance(value, list):
        return [_full(v) for v in value]
    return value


# Fields that came with the compact form; the old form did not have them.
_NEW_FIELDS = frozenset({"nvlink_total", "slow_omitted", "nvlink_omitted"})
_encoder = msgspec.json.Encoder()


def old_form_body(local: NodeSample) -> bytes:
    """A local reading as agents sent it before the compact form: every field written out, nulls and
    empty lists included, every NVLink link listed. For the bench's before/after and for the tests
    that an old sample (a rolling upgrade) still decodes."""
    return _encoder.encode(_full(local))
