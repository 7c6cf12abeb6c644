"""Runtime throughput on this machine: JetStream publish (batched acks) and consume (decode + ack).

Starts its own nats-server in a temp dir. Messages are 8-GPU node samples (~3 KiB of JSON).
Prints one JSON object: publish_msgs_per_s, consume_msgs_per_s and what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import NodeSample, encode
from services.runtime import Consumer, ConsumerOptions, Delivery, Publisher, connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from tests.builders import a_node_sample


async def measure(url: str, n: int, batch: int) -> dict[str, float]:
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    samples = [a_node_sample(f"n{i % 64:02d}", seq=i) for i in range(n)]
    size = len(encode(samples[0], source="bench")[1])

    publisher = Publisher(js, source="bench")
    t0 = time.perf_counter()
    await publisher.publish_many((s, f"{s.node}:{s.seq}", s.observed_at) for s in samples)
    publish_s = time.perf_counter() - t0

    done = asyncio.Event()
    count = 0

    async def handle(delivery: Delivery) -> None:
        nonlocal count
        assert isinstance(delivery.envelope.event, NodeSample)
        count += 1
        if count == n:
            done.set()

    consumer = Consumer(js, ConsumerOptions(stream="TELEMETRY", durable="bench", batch=batch), handler=handle)
    await consumer.start()
    stop = asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(consumer.run(stop))
    await done.wait()
    consume_s = time.perf_counter() - t0
    stop.set()
    await task
    await consumer.unsubscribe()
    await nc.drain()
    return {
        "messages": n,
        "message_bytes": size,
        "publish_msgs_per_s": round(n / publish_s),
        "consume_msgs_per_s": round(n / consume_s),
        "publish_mb_per_s": round(n * size / publish_s / 1e6, 1),
        "consume_batch": batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    configure_logging("error", json=True)
    with tempfile.TemporaryDirectory() as tmp, NatsServerProcess(Path(tmp) / "js") as server:
        result = asyncio.run(measure(server.url, args.messages, args.batch))
    result["consume_path"] = "pull fetch, decode + OTel span + handler + ack per message"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
