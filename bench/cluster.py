"""Chamber on a 3-server JetStream cluster on loopback (three nats-server processes joined by routes),
measured side by side in one run, so that the ratios hold even on a small shared machine:

1. publish rate of node samples into R3 TELEMETRY, with 1 partition (one stream, one RAFT leader) and
   with 4 (the subject mapping `{{partition(4, node)}}` in the servers' config, one stream per
   partition, leaders spread over the servers). Two clusters run at once; rounds alternate.
2. recorder ingest (GPU samples/s into chDB) on the 4-partition cluster with 1 and with 2 recorder
   processes (`chamber service recorder`), which share the partitions through their leases: time from
   the first publish of a burst until every partition's durable has acked everything.
3. failover: kill -9 the server leading TELEMETRY, time until a publish is accepted again (the client
   is given every server's URL), several trials.

Samples are the agent simulator's own NodeSamples (8 GPUs each), encoded by the product's codec.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import encode
from events.partitions import partition_stream, server_mapping_conf
from events.subjects import sample as sample_subject
from node_agent.sim.fleet import SimFleet
from node_agent.sim.models import MODELS
from services.runtime import connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_cluster import NatsCluster, move_leader, stream_leader

GPUS = 8
CHAMBER = str(Path(sys.executable).parent / "chamber")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc): steadier than wall-clock
    rates on a shared machine, and what sizing needs (cores per component)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def server_pids(cluster: NatsCluster) -> list[int]:
    return [s.proc.pid for s in cluster.servers if s.proc is not None]


def agent_messages(nodes: int, ticks: int) -> list[tuple[str, bytes, dict[str, str]]]:
    """(subject, body, headers) of `ticks` intervals of a simulated fleet: the agent's own samples."""
    fleet = SimFleet(seed=1, nodes=nodes, gpus_per_node=GPUS, model=MODELS["H100-80GB"])
    now = time.time() - ticks
    out = []
    for t in range(ticks):
        for name, node in fleet.nodes.items():
            sample = node.read("bench", t, now + t, 1.0).sample
            headers, body = encode(sample, source="bench/agent", id=f"{name}:{t}:{time.time_ns()}")
            out.append((sample_subject("bench", name), body, headers))
    return out


def start_cluster(root: Path, partitions: int, name: str) -> NatsCluster:
    conf = root / f"{name}.conf"
    conf.write_text(server_mapping_conf(partitions) or "# one partition: no mapping\n")
    cluster = NatsCluster(root / name, name=name, extra_args=["-c", str(conf)])
    cluster.start()
    return cluster


async def prepare(cluster: NatsCluster, partitions: int) -> Any:
    os.environ["CHAMBER_TELEMETRY_PARTITIONS"] = str(partitions)
    nc = await connect(cluster.url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js, replicas=3)
    if partitions > 1:  # one leader per server, round robin, as a settled cluster would have them
        servers = [f"n{i}" for i in range(len(cluster.servers))]
        for i in range(partitions):
            await move_leader(nc, partition_stream(i), servers[i % len(servers)])
    return nc


async def publish_round(nc: Any, messages: list[tuple[str, bytes, dict[str, str]]], window: int) -> float:
    """Node samples per second acked by JetStream, `window` acks in flight (the agent's outbox way)."""
    js = nc.jetstream()
    started = time.perf_counter()
    pending: list[Any] = []
    for subject, body, headers in messages:
        fresh = {**headers, "Nats-Msg-Id": f"{headers['Nats-Msg-Id']}:{started}"}
        pending.append(await js.publish_async(subject, body, headers=fresh))
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return len(messages) / (time.perf_counter() - started)


async def publish_rates(
    one: tuple[Any, NatsCluster], four: tuple[Any, NatsCluster], messages: list[Any], rounds: int, window: int
) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"1": [], "4": []}
    cpu: dict[str, float] = {"1": 0.0, "4": 0.0}
    await publish_round(one[0], messages[:200], window)  # warm-up: connections, stream files
    await publish_round(four[0], messages[:200], window)
    for _ in range(rounds):
        for key, (nc, cluster) in (("1", one), ("4", four)):
            before = cpu_s(server_pids(cluster))
            rates[key].append(await publish_round(nc, messages, window))
            cpu[key] += cpu_s(server_pids(cluster)) - before
    p1, p4 = statistics.median(rates["1"]), statistics.median(rates["4"])
    sent = len(messages) * rounds
    return {
        "node_samples_per_round": len(messages),
        "rounds": rounds,
        "acks_in_flight": window,
        "partitions_1_msgs_per_s": round(p1),
        "partitions_4_msgs_per_s": round(p4),
        "partitions_1_gpu_samples_per_s": round(p1 * GPUS),
        "partitions_4_gpu_samples_per_s": round(p4 * GPUS),
        "ratio_4_over_1": round(p4 / p1, 2),
        "all_rounds_msgs_per_s": {k: [round(r) for r in v] for k, v in rates.items()},
        # CPU of all three servers per node sample stored R3 (leader + 2 followers), in microseconds
        "servers_cpu_us_per_msg": {k: round(v * 1e6 / sent) for k, v in cpu.items()},
    }


async def pending(js: Any, streams: list[str]) -> int:
    total = 0
    for stream in streams:
        try:
            info = await js.consumer_info(stream, "recorder")
        except Exception:
            return -1  # not created yet
        total += info.num_pending + info.num_ack_pending
    return total


async def recorder_ingest(
    cluster: NatsCluster, nc: Any, messages: list[Any], recorders: int, work: Path, window: int
) -> dict[str, Any]:
    js = nc.jetstream()
    streams = [partition_stream(i) for i in range(4)]
    procs = []
    env = {**os.environ, "CHAMBER_TELEMETRY_PARTITIONS": "4", "PYTHONUNBUFFERED": "1"}
    for r in range(recorders):
        argv = [CHAMBER, "service", "recorder", "--nats", cluster.url, "--data-dir", str(work / f"wh-{recorders}-{r}"),
                "--partition-lease-ttl", "3", "--telemetry-consumers", "1", "--log-level", "warning"]  # fmt: skip
        log = (work / f"recorder-{recorders}-{r}.log").open("w")
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**env, "POD_NAME": f"rec-{r}"}))  # noqa: ASYNC220 (started once, not awaited)
    try:
        owners: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every partition owned, and by all recorders when balanced
            for stream in streams:
                try:
                    kv = await js.key_value(f"chamber_lease_recorder-{stream.lower()}")
                    owners[stream] = (await kv.get("leader")).value.decode().split(":")[0]
                except Exception:
                    owners.pop(stream, None)
            shares = sorted(list(owners.values()).count(o) for o in set(owners.values()))
            if len(owners) == 4 and shares == [4 // recorders] * recorders and await pending(js, streams) == 0:
                break
            await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"recorders did not share the partitions: {owners}")
        pids = [p.pid for p in procs]
        cpu_before = cpu_s(pids)
        started = time.perf_counter()
        await publish_round(nc, messages, window)
        while (left := await pending(js, streams)) != 0:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a recorder stopped; see its log in " + str(work))
            await asyncio.sleep(0.02 if left < 500 else 0.1)
        elapsed = time.perf_counter() - started
        cpu_used = cpu_s(pids) - cpu_before
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    return {
        "recorders": recorders,
        "partitions_per_recorder": sorted(list(owners.values()).count(o) for o in set(owners.values())),
        "gpu_samples": len(messages) * GPUS,
        "gpu_samples_per_s": round(len(messages) * GPUS / elapsed),
        # the recorders' CPU (fetch, decode, columns, chDB insert, ack) per GPU sample
        "recorder_cpu_us_per_gpu_sample": round(cpu_used * 1e6 / (len(messages) * GPUS), 1),
    }


async def failover(cluster: NatsCluster, trials: int) -> dict[str, Any]:
    """Kill -9 the TELEMETRY leader while publishing; seconds until a publish is acked again."""
    os.environ["CHAMBER_TELEMETRY_PARTITIONS"] = "1"
    nc = await connect(cluster.url, name="bench-failover")
    js = nc.jetstream()
    [(subject, body, headers)] = agent_messages(1, 1)
    times = []
    try:
        for trial in range(trials):
            await js.publish(subject, body, headers={**headers, "Nats-Msg-Id": f"warm-{trial}"})
            leader = await stream_leader(js, "TELEMETRY")
            assert leader is not None
            victim = cluster.server(leader)
            victim.kill()
            killed = time.perf_counter()
            n = 0
            while True:
                n += 1
                try:
                    await js.publish(subject, body, headers={**headers, "Nats-Msg-Id": f"f-{trial}-{n}"}, timeout=0.5)
                    break
                except Exception:
                    await asyncio.sleep(0.01)
            times.append(time.perf_counter() - killed)
            await asyncio.to_thread(victim.start)
            for _ in range(300):  # the restarted server catches up before the next trial
                info = await js.stream_info("TELEMETRY")
                if (
                    info.cluster
                    and len(info.cluster.replicas or []) == 2
                    and all(p.current for p in info.cluster.replicas or [])
                ):
                    break
                await asyncio.sleep(0.1)
    finally:
        await nc.close()
    return {
        "trials": trials,
        "seconds_to_first_accepted_publish": [round(t, 2) for t in times],
        "median_s": round(statistics.median(times), 2),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("error")
    with tempfile.TemporaryDirectory(prefix="chamber-bench-cluster-") as tmp:
        root = Path(tmp)
        messages = agent_messages(args.nodes, args.ticks)
        one_cluster = start_cluster(root, 1, "one")
        four_cluster = start_cluster(root, 4, "four")
        try:
            one = await prepare(one_cluster, 1)
            four = await prepare(four_cluster, 4)
            publish = await publish_rates((one, one_cluster), (four, four_cluster), messages, args.rounds, args.window)
            await one.close()
            one_cluster.stop()  # its servers would only take CPU from the recorders
            burst = agent_messages(args.nodes, args.ingest_ticks)
            ingest = [await recorder_ingest(four_cluster, four, burst, r, root, args.window) for r in (1, 2)]
            await four.close()
            four_cluster.stop()
            one_cluster = start_cluster(root, 1, "failover")
            await (await prepare(one_cluster, 1)).close()
            kill = await failover(one_cluster, args.kill_trials)
        finally:
            one_cluster.stop()
            four_cluster.stop()
    return {
        "machine_cpus": os.cpu_count(),
        "cluster": "3 nats-server processes on loopback, routes, JetStream, streams R3",
        "message_bytes": len(messages[0][1]),
        "gpus_per_sample": GPUS,
        "publish": publish,
        "recorder_ingest": {
            "runs": ingest,
            "ratio_2_over_1": round(ingest[1]["gpu_samples_per_s"] / ingest[0]["gpu_samples_per_s"], 2),
        },
        "failover": kill,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=250, help="simulated nodes (default 250)")
    parser.add_argument("--ticks", type=int, default=8, help="intervals per round (default 8: 2,000 samples)")
    parser.add_argument("--ingest-ticks", type=int, default=12, help="intervals in the ingest burst (default 12)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating publish rounds (default 2)")
    parser.add_argument("--window", type=int, default=256, help="publish acks in flight (default 256)")
    parser.add_argument("--kill-trials", type=int, default=2, help="leader kills (default 2)")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
