"""Fault-to-isolation latency on this machine.

A 1,000-node simulated fleet (8 GPUs each) is announced on FLEET; the health service runs in this
process with its Kubernetes actuator pointed at a local API-server stub. 1,000 faults (a DBE on one
GPU of every node: each is a GPU isolation; or XID 79 with --node-faults: node isolations) are published
at a steady rate. Measured per fault:
publish -> GpuIsolated event seen on FLEET, and publish -> the node PATCH reaching the stub.
The isolation budget is lifted for the run (a 100 % share), or most of these would be held. Meanwhile every node samples
once a second (1,000 samples/s into health), unless --no-samples.

Prints one JSON object: p50_ms, p99_ms, max_ms (event), patch_p50_ms, patch_p99_ms, faults, nodes, rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from msgspec.structs import replace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import GpuIsolated, NodeIsolated, decode
from events.faults import FaultKind, Severity
from services.health import service as health
from services.health.kube import KubeActuator
from services.health.policy import Budget, load_policy
from services.runtime import Publisher, connect, ensure_streams
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from tests.health_builders import a_fault, a_node_discovered, a_sample
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub, a_k8s_node


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def sample_fleet(url: str, nodes: int) -> None:
    """Every node's agent sampling once a second (8 GPUs, ~3 KiB), as background load on health."""
    nc = await connect(url, name="bench-sampler")
    publisher = Publisher(nc.jetstream(), source="bench-sampler")
    names = [f"node-{i:04d}" for i in range(nodes)]
    seq = 0
    while True:
        seq += 1
        t0 = time.perf_counter()
        now = time.time()
        await publisher.publish_many((a_sample(n, cluster="bench", at=now, seq=seq), None, None) for n in names)
        await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))


# --amd CLASS: the AMD fault classes, as the agent's AMD detectors publish them (kind, block, AFID, severity)
AMD_FAULTS: dict[str, tuple[FaultKind, str | None, int | None, Severity]] = {
    "umc": (FaultKind.AMD_RAS_UE, "umc", None, Severity.CRITICAL),  # isolate the GPU
    "bad_pages": (FaultKind.AMD_BAD_PAGES, None, None, Severity.CRITICAL),  # isolate the GPU
    "cper": (FaultKind.AMD_CPER, None, 30, Severity.CRITICAL),  # a fatal CPER record: isolate the GPU
    "reset": (FaultKind.GPU_RESET_STUCK, None, None, Severity.CRITICAL),  # isolate the node
    "xgmi": (FaultKind.XGMI, None, None, Severity.CRITICAL),  # isolate the node
}


async def measure(
    url: str, nodes: int, faults: int, rate: float, with_samples: bool, node_faults: bool, amd: str | None = None
) -> dict[str, Any]:
    names = [f"node-{i:04d}" for i in range(nodes)]
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    publisher = Publisher(js, source="bench")
    await publisher.publish_many((a_node_discovered(n, cluster="bench"), f"disc-{n}", None) for n in names)

    published: dict[str, float] = {}
    seen: dict[str, float] = {}
    patched: dict[str, float] = {}
    node_of: dict[str, str] = {}
    done = asyncio.Event()

    async def on_fleet(msg: Any) -> None:
        event = decode(msg.headers, msg.data).event
        if isinstance(event, GpuIsolated | NodeIsolated):
            for fid in event.fault_ids:
                seen.setdefault(fid, time.perf_counter())
            if len(seen) >= faults:
                done.set()

    sub = await nc.subscribe("chamber.fleet.>", cb=on_fleet)
    policy = load_policy()
    policy = replace(policy, budget=Budget(max_share=1.0, min_nodes=1, window_s=policy.budget.window_s))
    stop = asyncio.Event()
    with KubeStub([a_k8s_node(n) for n in names]) as stub:

        def on_request(request: Any) -> None:
            if request.method == "PATCH":
                patched.setdefault(request.path.rsplit("/", 1)[-1], time.perf_counter())

        stub.on_request = on_request
        args = argparse.Namespace(nats=url, cluster="bench", policy=None, dry_run=False, tick=1.0)
        shells: list[health.HealthShell] = []

        async def setup(ctx: ServiceContext) -> None:
            shells.append(await health.setup(ctx, args, policy, actuator=KubeActuator(stub.client())))

        task = asyncio.create_task(serve("health", url, setup, stop))
        await eventually(lambda: bool(shells) and shells[0].ready and len(shells[0].state.nodes) >= nodes, 60)

        # The agents are other processes in a real fleet: sample from a separate process here too.
        sampling = None
        if with_samples:
            sampling = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--sampler", url, "--nodes", str(nodes)
            )
        interval = 1.0 / rate
        start = time.perf_counter()
        for i in range(faults):
            node = names[i % nodes]
            if amd is not None:
                kind, block, afid, severity = AMD_FAULTS[amd]
                fault = a_fault(node, kind=kind, gpu=i % 8, at=time.time(), cluster="bench", fault_id=f"f{i}")
                fault = replace(fault, severity=severity, ras_block=block, afid=afid)
            elif node_faults:  # XID 79: the whole node (read, cordon + taint, condition)
                fault = a_fault(node, xid=79, gpu=i % 8, at=time.time(), cluster="bench", fault_id=f"f{i}")
            else:  # a DBE: one GPU (the node's isolated-GPU list, written without a read)
                fault = a_fault(
                    node, kind=FaultKind.ECC_DBE, gpu=i % 8, at=time.time(), cluster="bench", fault_id=f"f{i}"
                )
            node_of[fault.fault_id] = node
            target = start + i * interval
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            published[fault.fault_id] = time.perf_counter()
            await publisher.publish(fault, id=fault.fault_id)
        await asyncio.wait_for(done.wait(), 120)
        if sampling is not None:
            sampling.terminate()
            await sampling.wait()
        await eventually(lambda: len(patched) >= len({node_of[f] for f in published}), 60)
        stop.set()
        await asyncio.wait_for(task, 30)
    await sub.unsubscribe()
    await nc.drain()

    event_ms = [(seen[f] - t) * 1000 for f, t in published.items() if f in seen]
    patch_ms = [(patched[node_of[f]] - t) * 1000 for f, t in published.items() if node_of[f] in patched]
    return {
        "faults": faults,
        "nodes": nodes,
        "rate_per_s": rate,
        "fault": f"amd {amd}" if amd else "xid79 (isolate node)" if node_faults else "ecc_dbe (isolate gpu)",
        "fleet_sampling_hz": 1.0 if with_samples else 0.0,
        "isolations": len(event_ms),
        "p50_ms": round(percentile(event_ms, 0.50), 2),
        "p99_ms": round(percentile(event_ms, 0.99), 2),
        "max_ms": round(max(event_ms), 2),
        "patch_p50_ms": round(percentile(patch_ms, 0.50), 2) if patch_ms else None,
        "patch_p99_ms": round(percentile(patch_ms, 0.99), 2) if patch_ms else None,
        "patches": len(patch_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="faults per second (default 200)")
    parser.add_argument("--no-samples", action="store_true", help="no background 1 Hz samples from every node")
    parser.add_argument("--node-faults", action="store_true", help="XID 79 (node isolation) instead of DBEs")
    parser.add_argument("--amd", choices=sorted(AMD_FAULTS), help="an AMD fault class instead (see AMD_FAULTS)")
    parser.add_argument("--sampler", metavar="URL", help=argparse.SUPPRESS)  # internal: the sampling process
    args = parser.parse_args()
    configure_logging("error")
    if args.sampler:
        asyncio.run(sample_fleet(args.sampler, args.nodes))
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServerProcess(Path(tmp) / "js", log_file=Path(tmp) / "nats.log")
        server.start()
        try:
            result = asyncio.run(
                measure(server.url, args.nodes, args.faults, args.rate, not args.no_samples, args.node_faults, args.amd)
            )
        finally:
            server.kill()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
