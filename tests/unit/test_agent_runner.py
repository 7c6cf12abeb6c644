"""One node's loop body: inventory at start, on change and every 60 s; one sample per interval;
message ids are node + sequence; the envelope is the codec's."""

from __future__ import annotations

from pathlib import Path

import msgspec

from events import NodeInventory, NodeSample, decode, encode
from node_agent.nvml_adapter import NvmlSampler
from node_agent.runner import NodeFacts, NodeRunner, SeqStore, envelope
from node_agent.sim.fleet import SimNode
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind
from tests.unit.fake_pynvml import FakeNvml


def kinds_at(runner: NodeRunner, t: float) -> list[str]:
    return [Kind(r.kind).name for r in runner.tick(t, 1.0)]


def test_inventory_at_start_then_every_60_s_and_a_sample_every_tick() -> None:
    runner = NodeRunner("c1", "sim-000", SimNode(1, "sim-000", 2, gpu_model("A100-80GB")), NodeFacts(simulated=True))
    ticks = {t: kinds_at(runner, 1000.0 + t) for t in range(0, 125)}
    with_inventory = [t for t, kinds in ticks.items() if "INVENTORY" in kinds]
    assert with_inventory == [0, 60, 120]
    assert all(kinds.count("SAMPLE") == 1 for kinds in ticks.values())
    assert runner.seq == 125


def test_a_changed_inventory_is_announced_at_the_next_check() -> None:
    fake = FakeNvml(gpus=2)
    runner = NodeRunner("c1", "gpu-1", NvmlSampler.open(fake, node="gpu-1", watch_xids=False), NodeFacts())
    assert "INVENTORY" in kinds_at(runner, 1000.0)
    assert "INVENTORY" not in kinds_at(runner, 1011.0)
    fake.gpus[1].serial = "replaced-board"
    kinds_at(runner, 1015.0)  # not checked yet (every 10 s)
    records = runner.tick(1021.0, 1.0)
    inventory = decode(records[0].headers, records[0].body).event
    assert isinstance(inventory, NodeInventory) and inventory.gpus[1].serial == "replaced-board"


def test_message_ids_are_node_and_sequence_and_the_envelope_is_the_codecs() -> None:
    runner = NodeRunner("c1", "sim-000", SimNode(1, "sim-000", 1, gpu_model("H100-80GB")), NodeFacts(simulated=True))
    runner.seq = 41
    records = runner.tick(1000.0, 1.0)
    assert [r.msg_id for r in records] == ["c1/sim-000/41/inventory", "c1/sim-000/41"]
    sample = decode(records[1].headers, records[1].body).event
    assert (
        isinstance(sample, NodeSample)
        and sample.seq == 41
        and records[1].subject == "chamber.telemetry.sample.c1.sim-000"
    )
    headers, body = envelope(sample, "src", "c1/sim-000/41", 1000.0)
    assert headers.pop("traceparent").startswith("00-")  # each sample starts a trace of its own
    assert (headers, body) == encode(sample, source="src", id="c1/sim-000/41", time=1000.0)


def test_the_sequence_survives_a_restart(tmp_path: Path) -> None:
    store = SeqStore(tmp_path / "seq.json")
    runners = [
        NodeRunner("c1", n, SimNode(1, n, 1, gpu_model("H100-80GB")), NodeFacts(), seq=store.get(n)) for n in ("a", "b")
    ]
    for t in range(5):
        for r in runners:
            r.tick(1000.0 + t, 1.0)
    store.save(runners)
    again = SeqStore(tmp_path / "seq.json")
    assert (again.get("a"), again.get("b"), again.get("c")) == (5, 5, 0)
    assert msgspec.json.decode((tmp_path / "seq.json").read_bytes()) == {"a": 5, "b": 5}


def test_the_inventory_carries_the_hosts_cpu_and_memory(tmp_path: Path) -> None:
    from node_agent.host_capacity import meminfo_mib, read_capacity, simulated_capacity

    (tmp_path / "meminfo").write_text("MemTotal:       2113470212 kB\nMemFree:        1000 kB\n")
    cpu, memory = read_capacity(tmp_path)
    assert memory == 2113470212 // 1024 and cpu is not None and cpu % 1000 == 0 and cpu >= 1000
    assert meminfo_mib(tmp_path / "absent") is None
    assert simulated_capacity(8) == (224_000, 2 * 1024 * 1024) and simulated_capacity(2)[0] == 56_000
    facts = NodeFacts(simulated=True, cpu_milli=56_000, memory_mib=524_288)
    runner = NodeRunner("c1", "sim-000", SimNode(1, "sim-000", 2, gpu_model("A100-80GB")), facts)
    record = runner.tick(1000.0, 1.0)[0]
    inventory = decode(record.headers, record.body).event
    assert isinstance(inventory, NodeInventory) and (inventory.cpu_milli, inventory.memory_mib) == (56_000, 524_288)


def test_a_simulated_agent_and_a_real_one_announce_a_capacity(tmp_path: Path) -> None:
    from node_agent.agent import Agent, AgentOptions

    sim = Agent(AgentOptions(nats="-", simulate=True, nodes=2, gpus_per_node=4, spool_dir=tmp_path, sysfs_root=None))
    assert {(r.facts.cpu_milli, r.facts.memory_mib) for r in sim.runners} == {(112_000, 1024 * 1024)}
    real = Agent(
        AgentOptions(nats="-", node="g1", spool_dir=tmp_path, sysfs_root=None, vendor="nvidia"), nvml=FakeNvml(gpus=2)
    )
    [runner] = real.runners
    assert runner.facts.cpu_milli is not None and runner.facts.memory_mib is not None and runner.facts.memory_mib > 0
