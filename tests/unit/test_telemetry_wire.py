"""The compact wire form of node samples: what the simulated agent publishes, how big it is, that every
consumer decodes it (and the old full form) to the same facts, and what happens to a sample too big."""

from __future__ import annotations

import msgspec

from events import GpuSample, NodeSample, ProcessInfo, decode
from events.telemetry import SLOW_FIELDS, NvLinkCounters, NvLinkTotals, compact_links
from node_agent.runner import MAX_SAMPLE_BYTES, NodeFacts, NodeRunner
from node_agent.sim.fleet import SimFaultKind, SimFleet, SimNode
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind
from node_agent.wire import FULL_EVERY_S, WireForm, old_form_body, omit_slow
from services.recorder.bulk_samples import sample_table
from services.recorder.rows import LeanNodeSample, Recorded, sample_columns

T0 = 1_800_000_000.0
_lean = msgspec.json.Decoder(LeanNodeSample)


def a_busy_h100_node() -> SimNode:
    """8 H100s, each running a job: every field the simulator fills is filled."""
    fleet = SimFleet(seed=1, nodes=1, gpus_per_node=8, model=gpu_model("H100-80GB"))
    [(name, node)] = fleet.nodes.items()
    fleet.assign({name: {i: f"job-{i}" for i in range(8)}})
    return node


def sample_bodies(runner: NodeRunner, t: float) -> list[bytes]:
    return [r.body for r in runner.tick(t, 1.0) if r.kind == Kind.SAMPLE]


def test_an_8_gpu_h100_sample_is_at_most_4_kb_with_every_field_and_several_times_smaller_than_before() -> None:
    node = a_busy_h100_node()
    runner = NodeRunner("c1", node.name, node, NodeFacts(simulated=True))
    [full] = sample_bodies(runner, T0)
    [steady] = sample_bodies(runner, T0 + 1)
    before = old_form_body(node.read("c1", 99, T0 + 2, 1.0).sample)
    assert len(full) <= 4096
    assert len(steady) < len(full)
    assert len(before) > 4 * len(full)
    carried = msgspec.json.decode(full)["gpus"][0]
    assert {"memory_total_mib", "power_limit_w", "mem_clock_mhz", "ecc_dbe_volatile", "row_remap"} <= set(carried)
    assert "slow_omitted" not in msgspec.json.decode(full)
    assert msgspec.json.decode(steady)["slow_omitted"] is True


def test_the_wire_form_decodes_to_the_local_reading_with_the_links_compacted() -> None:
    node = a_busy_h100_node()
    local = node.read("c1", 0, T0, 1.0).sample
    wire = WireForm()(local)
    headers_body = NodeRunner("c1", node.name, node, NodeFacts())._record(Kind.SAMPLE, "s", wire, "id", T0)
    decoded = decode(headers_body.headers, headers_body.body).event
    assert decoded == msgspec.structs.replace(local, gpus=[compact_links(g) for g in local.gpus])
    assert all(g.nvlink == [] and g.nvlink_total == NvLinkTotals() for g in decoded.gpus)  # type: ignore[attr-defined]


def test_links_with_errors_are_listed_and_the_totals_always_sent() -> None:
    links = [NvLinkCounters(link=i) for i in range(18)]
    links[3] = NvLinkCounters(link=3, crc_flit_errors=7, replay_errors=1)
    links[9] = NvLinkCounters(link=9, crc_data_errors=2)
    gpu = compact_links(GpuSample(index=0, uuid="u", nvlink=links))
    assert [link.link for link in gpu.nvlink] == [3, 9]
    assert gpu.nvlink_total == NvLinkTotals(crc_flit_errors=7, crc_data_errors=2, replay_errors=1)
    every = compact_links(
        GpuSample(index=0, uuid="u", nvlink=[NvLinkCounters(link=i, replay_errors=1) for i in range(18)])
    )
    assert len(every.nvlink) == 18 and every.nvlink_total == NvLinkTotals(replay_errors=18)
    unknown = compact_links(GpuSample(index=0, uuid="u", nvlink=[NvLinkCounters(link=0, crc_flit_errors=None)]))
    assert unknown.nvlink == [] and unknown.nvlink_total == NvLinkTotals(crc_flit_errors=None)
    assert compact_links(GpuSample(index=0, uuid="u")).nvlink_total is None  # no NVLink: nothing to sum
    assert msgspec.json.encode(NvLinkTotals()) == b"{}"  # an error-free GPU pays two bytes


def test_slow_fields_come_when_they_change_and_at_least_every_minute() -> None:
    node = a_busy_h100_node()
    form = WireForm()
    sent = {t: form(node.read("c1", t, T0 + t, 1.0).sample) for t in range(0, 5)}
    assert [s.slow_omitted for s in sent.values()] == [False, True, True, True, True]
    omitted = sent[1].gpus[0]
    assert all(getattr(omitted, f) is None for f in SLOW_FIELDS) and omitted.utilization_pct is not None
    node.inject(SimFaultKind.ECC_DBE, 2, None, T0 + 5)
    assert form(node.read("c1", 5, T0 + 5, 1.0).sample).slow_omitted is False  # a DBE goes out at once
    assert form(node.read("c1", 6, T0 + 6, 1.0).sample).slow_omitted is True
    at_minute = form(node.read("c1", 7, T0 + 5 + FULL_EVERY_S, 1.0).sample)
    assert at_minute.slow_omitted is False and at_minute.gpus[2].ecc_dbe_volatile == 1


def test_per_link_counters_come_once_a_minute_and_the_totals_every_interval() -> None:
    node = a_busy_h100_node()
    node.gpus[0].crc_rate = 1000.0  # a storm on link 0 of GPU 0: its counter moves every interval
    form = WireForm()
    sent = [form(node.read("c1", t, T0 + t, 1.0).sample) for t in range(0, 62)]
    with_links = [t for t, s in enumerate(sent) if not s.nvlink_omitted]
    assert with_links == [0, 60]
    assert [link.link for link in sent[0].gpus[0].nvlink] == [0] and sent[1].gpus[0].nvlink == []
    totals = [s.gpus[0].nvlink_total.crc_flit_errors for s in sent]  # type: ignore[union-attr]
    assert totals == sorted(totals) and totals[0] < totals[30] < totals[61]  # current in every sample
    assert sent[60].gpus[0].nvlink[0].crc_flit_errors == totals[60]


def test_an_old_full_form_sample_decodes_like_the_compact_one_in_every_consumer() -> None:
    """A rolling upgrade: old agents still send every field, nulls and all links."""
    node = a_busy_h100_node()
    local = node.read("c1", 0, T0, 1.0).sample
    old = old_form_body(local)
    runner = NodeRunner("c1", node.name, node, NodeFacts())
    new = runner._record(Kind.SAMPLE, "s", WireForm()(local), "c1/x/0", T0)
    old_event = decode(new.headers, old).event  # same headers: same type, same version
    new_event = decode(new.headers, new.body).event
    assert isinstance(old_event, NodeSample) and isinstance(new_event, NodeSample)
    assert old_event == local  # every link, no totals: as it was sent
    assert [compact_links(g) for g in old_event.gpus] == new_event.gpus  # the upcast gives the new form
    assert _lean.decode(old) == _lean.decode(new.body)  # the recorder's strict decode
    bulk = sample_table([old, new.body], ["a", "a"])  # and its bulk decode
    rows = bulk.to_pylist()
    assert rows[:8] == rows[8:]
    items = [
        Recorded(event=_lean.decode(b), id="a", source="s", time="", stream="TELEMETRY", subject="x", stream_seq=1)
        for b in (old, new.body)
    ]
    assert bulk.equals(sample_columns(items))


def test_a_sample_without_its_slow_fields_stores_nulls_for_them_in_both_decodes() -> None:
    node = a_busy_h100_node()
    runner = NodeRunner("c1", node.name, node, NodeFacts())
    bodies = sample_bodies(runner, T0) + sample_bodies(runner, T0 + 1)
    table = sample_table(bodies, ["a", "b"])
    items = [
        Recorded(event=_lean.decode(b), id=i, source="s", time="", stream="TELEMETRY", subject="x", stream_seq=1)
        for b, i in zip(bodies, ["a", "b"], strict=True)
    ]
    assert table.equals(sample_columns(items))
    assert table.column("memory_total_mib").to_pylist() == [81559.0] * 8 + [None] * 8
    assert None not in table.column("utilization_pct").to_pylist()


class _HugeSampler:
    """A node whose samples do not fit a message: with many processes, or giant throttle reasons."""

    def __init__(self, *, processes: int = 0, reason_bytes: int = 0) -> None:
        self.processes, self.reasons = processes, ["r" * reason_bytes] if reason_bytes else []

    def read(self, cluster: str, seq: int, now: float, interval_s: float):  # type: ignore[no-untyped-def]
        from node_agent.detectors import Reading

        procs = [ProcessInfo(pid=p, name="worker-with-a-long-name") for p in range(self.processes)]
        gpu = GpuSample(index=0, uuid="u", utilization_pct=50.0, processes=procs, throttle_reasons=self.reasons)
        return Reading(
            NodeSample(cluster=cluster, node="big", seq=seq, observed_at=now, interval_s=interval_s, gpus=[gpu])
        )

    def inventory_gpus(self):  # type: ignore[no-untyped-def]
        return []

    def limits(self):  # type: ignore[no-untyped-def]
        return {}


def test_a_sample_over_the_message_limit_is_cut_down_with_a_reason_and_counted() -> None:
    runner = NodeRunner("c1", "big", _HugeSampler(processes=20_000), NodeFacts())
    [body] = sample_bodies(runner, T0)
    assert len(body) <= MAX_SAMPLE_BYTES
    sample = msgspec.json.decode(body, type=NodeSample)
    assert sample.gpus[0].processes == [] and sample.gpus[0].utilization_pct == 50.0 and sample.nvlink_omitted
    assert runner.samples_reduced == 1 and runner.samples_refused == 0
    assert "without process lists" in runner.refusals[0]


def test_a_sample_that_cannot_be_cut_down_enough_is_refused_not_sent_and_counted() -> None:
    runner = NodeRunner("c1", "big", _HugeSampler(reason_bytes=MAX_SAMPLE_BYTES + 1), NodeFacts())
    assert sample_bodies(runner, T0) == []
    assert runner.samples_refused == 1 and "not sent" in runner.refusals[0]
    assert runner.seq == 1  # the next sample has the next sequence: consumers see the gap
    runner.sampler = _HugeSampler()  # fits again, same slow fields: it carries them, not "unchanged"
    [body] = sample_bodies(runner, T0 + 1)
    assert msgspec.json.decode(body, type=NodeSample).slow_omitted is False


def test_the_published_json_schema_accepts_the_compact_and_the_old_form() -> None:
    import json
    from pathlib import Path

    import jsonschema

    path = Path(__file__).resolve().parents[2] / "schemas/events/io.chamber.telemetry.node_sample.v1.json"
    validator = jsonschema.Draft202012Validator(json.loads(path.read_text()))
    node = a_busy_h100_node()
    node.gpus[0].crc_rate = 1000.0  # NVLink errors: a listed link too
    runner = NodeRunner("c1", node.name, node, NodeFacts())
    bodies = sample_bodies(runner, T0) + sample_bodies(runner, T0 + 1)
    bodies.append(old_form_body(node.read("c1", 9, T0 + 2, 1.0).sample))
    assert b'"link":0' in bodies[0] and b'"slow_omitted":true,"nvlink_omitted":true' in bodies[1]
    for body in bodies:
        validator.validate(json.loads(body))


def test_faults_are_detected_on_the_full_local_reading_whatever_the_wire_leaves_out() -> None:
    node = a_busy_h100_node()
    runner = NodeRunner("c1", node.name, node, NodeFacts(simulated=True))
    runner.tick(T0, 1.0)  # the first sample carries everything; from here links and slow fields are left out
    node.inject(SimFaultKind.NVLINK, 3, None, T0 + 1)
    records = [r for t in range(1, 6) for r in runner.tick(T0 + t, 1.0)]
    faults = [decode(r.headers, r.body).event for r in records if r.kind == Kind.FAULT]
    samples = [msgspec.json.decode(r.body, type=NodeSample) for r in records if r.kind == Kind.SAMPLE]
    assert all(s.nvlink_omitted and s.gpus[3].nvlink == [] for s in samples)  # no per-link detail sent
    assert any(getattr(f, "gpu_index", None) == 3 for f in faults)  # yet the NVLink fault was found


def test_omitting_the_slow_fields_resets_exactly_the_slow_fields() -> None:
    """`omit_slow` writes its keywords out (cheaper than a dict): it must be SLOW_FIELDS, no more, no less."""
    sample = msgspec.structs.replace(
        GpuSample(index=3, uuid="u", utilization_pct=50.0, throttle_reasons=["sw_power_cap"]),
        **{f: 1 for f in SLOW_FIELDS},
    )
    omitted = omit_slow(sample)
    fields = GpuSample.__struct_fields__
    assert {f for f in fields if getattr(omitted, f) != getattr(sample, f)} == set(SLOW_FIELDS)
    assert all(getattr(omitted, f) is None for f in SLOW_FIELDS)  # each slow field's default


def test_an_amd_gpus_health_goes_out_as_the_same_bytes_from_its_cached_json() -> None:
    """WireForm sends an AMD GPU's health as JSON made once per health object (msgspec.Raw), and, as a
    slow field, only in a sample that carries the slow fields: the first, and at once when it changes.
    The bodies are byte for byte what encoding the samples themselves gives."""
    from events.codec import encode_body
    from events.telemetry import AmdGpuHealth, RasBlockCount

    def amd_sample(seq: int, health: AmdGpuHealth) -> NodeSample:
        gpus = [
            GpuSample(index=i, uuid=f"GPU-{i}", utilization_pct=80.0 + seq, memory_total_mib=196608.0,
                      ecc_sbe_volatile=2, pcie_replay_count=0, amd=health)
            for i in range(2)
        ]  # fmt: skip
        return NodeSample(cluster="c1", node="mi", seq=seq, observed_at=T0 + seq, interval_s=1.0, gpus=gpus)

    quiet = AmdGpuHealth(ras=[RasBlockCount(block="umc", de=0), RasBlockCount(block="gfx")], bad_pages=0)
    hurt = AmdGpuHealth(ras=[RasBlockCount(block="umc", ue=1, de=0), RasBlockCount(block="gfx")], bad_pages=2)
    form = WireForm()
    for seq, health in enumerate([quiet, quiet, quiet, hurt, hurt]):
        local = amd_sample(seq, health)
        sent = form(local)
        full = seq in (0, 3)  # the first sample, and the one where the health changed
        assert all(isinstance(g.amd, msgspec.Raw) for g in sent.gpus) == full
        assert all(g.amd is None for g in sent.gpus) == (not full)
        reference = msgspec.structs.replace(
            local,
            gpus=[g if full else msgspec.structs.replace(g, **dict.fromkeys(SLOW_FIELDS)) for g in local.gpus],
            slow_omitted=not full,
            nvlink_omitted=seq != 0,
        )
        assert encode_body(sent) == encode_body(reference)
        assert (b'"ue":1' in encode_body(sent)) == (seq == 3)
