"""The operator's sizing sheet: nodes x sampling interval -> NATS bytes/s, NATS disk, warehouse bytes/day.

Everything is measured on this machine with the product's own code:
- the samples are what the simulated agent publishes (`NodeRunner` over `SimFleet`, 8 H100s per node,
  a job on every GPU, the compact wire form with its once-a-minute full samples), with their headers;
- NATS: those messages stored in TELEMETRY by a real nats-server (bytes on disk per message, as
  the stream reports them);
- the warehouse: the same samples decoded by the recorder (`bulk_samples.sample_table`) into chDB,
  merged (OPTIMIZE FINAL), and the bytes per row of the raw table and of the minute rollup read from
  `system.parts` (ClickHouse's compression as it stores them).
Prints one JSON object; `--markdown` prints the README table instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.streams import TELEMETRY_MAX_AGE_S, TELEMETRY_MAX_BYTES
from node_agent.runner import NodeFacts, NodeRunner
from node_agent.sim.fleet import SimFleet
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind, Record
from services.recorder.bulk_samples import sample_table
from services.runtime import connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.rollup import insert_samples

GPUS = 8
FLEETS = (16, 100, 1000, 10_000)
INTERVALS = (1.0, 10.0, 60.0)


def simulate(nodes: int, seconds: int, start: float) -> list[Record]:
    """Every record the simulated agent publishes for `nodes` busy nodes over `seconds` intervals."""
    fleet = SimFleet(seed=1, nodes=nodes, gpus_per_node=GPUS, model=gpu_model("H100-80GB"), prefix="size")
    fleet.assign({name: {g: f"job-{name}-{g}" for g in range(GPUS)} for name in fleet.nodes})
    runners = [NodeRunner("sizing", name, node, NodeFacts(simulated=True)) for name, node in fleet.nodes.items()]
    out: list[Record] = []
    for t in range(seconds):
        for runner in runners:
            out.extend(r for r in runner.tick(start + t, 1.0) if r.kind in (Kind.SAMPLE, Kind.INVENTORY))
    return out


def wire_bytes(record: Record) -> int:
    """What the message costs on the wire: body, subject and headers (NATS/1.0 header block)."""
    headers = sum(len(k) + len(v) + 4 for k, v in record.headers.items()) + 12
    return len(record.body) + len(record.subject) + headers


async def nats_stored_bytes(records: list[Record], store: Path) -> float:
    """Bytes TELEMETRY keeps on disk per message, as the stream reports them."""
    server = NatsServerProcess(store)
    server.start()
    try:
        nc = await connect(server.url, name="sizing")
        js = nc.jetstream()
        await ensure_streams(js)
        futures = []
        for r in records:
            futures.append(await js.publish_async(r.subject, r.body, headers=r.headers))
            if len(futures) >= 1000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
        state = (await js.stream_info("TELEMETRY")).state
        await nc.close()
        return state.bytes / state.messages
    finally:
        server.stop()


def warehouse_bytes_per_row(records: list[Record], data_dir: Path) -> dict[str, float]:
    samples = [r for r in records if r.kind == Kind.SAMPLE]
    warehouse = ChdbWarehouse(data_dir)
    try:
        migrate(warehouse)
        for i in range(0, len(samples), 2000):
            chunk = samples[i : i + 2000]
            insert_samples(warehouse, sample_table([r.body for r in chunk], [r.msg_id for r in chunk]))
        for table in ("gpu_samples", "gpu_minute_rollup"):
            warehouse.command(f"OPTIMIZE TABLE {table} FINAL")
        rows = warehouse.query(
            "SELECT table, sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes) FROM system.parts "
            "WHERE active AND database = currentDatabase() AND table IN ('gpu_samples', 'gpu_minute_rollup') "
            "GROUP BY table"
        ).rows
    finally:
        warehouse.close()
    out: dict[str, float] = {}
    for name, count, on_disk, raw in rows:
        table = "gpu_minute" if name == "gpu_minute_rollup" else name  # the table behind the view
        out[f"{table}_rows"] = int(count)
        out[f"{table}_bytes_per_row"] = round(int(on_disk) / int(count), 2)
        out[f"{table}_compression"] = round(int(raw) / int(on_disk), 1)
    return out


def sheet(measured: dict[str, float], keep_s: float, cap: int) -> list[dict[str, float]]:
    rows = []
    for nodes in FLEETS:
        for interval in INTERVALS:
            msgs_per_s = nodes / interval + nodes / 60.0  # samples, and an inventory a minute per node
            wire_per_s = (
                nodes / interval * measured["sample_wire_bytes"] + nodes / 60.0 * measured["inventory_wire_bytes"]
            )
            stored_per_s = msgs_per_s * measured["nats_stored_bytes_per_message"]
            raw_rows_day = nodes * GPUS * 86400 / interval
            rollup_rows_day = nodes * GPUS * 1440 * min(1.0, 60.0 / interval)  # a minute with no sample has no row
            rows.append(
                {
                    "nodes": nodes,
                    "interval_s": interval,
                    "nats_mb_per_s": round(wire_per_s / 1e6, 3),
                    "nats_disk_mb": round(min(cap, stored_per_s * keep_s) / 1e6, 1),
                    "nats_kept_min": round(min(keep_s, cap / stored_per_s) / 60, 1),  # the cap may bind first
                    "warehouse_raw_gb_per_day": round(raw_rows_day * measured["gpu_samples_bytes_per_row"] / 1e9, 3),
                    "warehouse_rollup_gb_per_day": round(
                        rollup_rows_day * measured["gpu_minute_bytes_per_row"] / 1e9, 4
                    ),
                }
            )
    return rows


def markdown(rows: list[dict[str, float]], keep_s: float, cap: int) -> str:
    lines = [
        f"| nodes (8 GPUs) | interval | NATS in | NATS disk (keep {keep_s / 60:g} min, cap {cap / 2**30:g} GiB) "
        "| minutes kept | warehouse raw / day | rollups / day |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['interval_s']:g} s | {_size(r['nats_mb_per_s'] * 1e6)}/s | "
            f"{_size(r['nats_disk_mb'] * 1e6)} | {r['nats_kept_min']:g} | "
            f"{_size(r['warehouse_raw_gb_per_day'] * 1e9)} | "
            f"{_size(r['warehouse_rollup_gb_per_day'] * 1e9)} |"
        )
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes measured")
    parser.add_argument("--seconds", type=int, default=1800, help="intervals (1 s) simulated per node")
    parser.add_argument("--keep-min", type=float, default=TELEMETRY_MAX_AGE_S / 60, help="TELEMETRY max age, minutes")
    parser.add_argument("--cap-mb", type=float, default=TELEMETRY_MAX_BYTES / 2**20, help="TELEMETRY byte cap, MiB")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    args = parser.parse_args()
    configure_logging("error")
    start = float(int(time.time()) - args.seconds)  # recent: inside the warehouse's TTL
    records = simulate(args.nodes, args.seconds, start)
    samples = [r for r in records if r.kind == Kind.SAMPLE]
    inventories = [r for r in records if r.kind == Kind.INVENTORY]
    measured: dict[str, float] = {
        "simulated_nodes": args.nodes,
        "simulated_seconds": args.seconds,
        "sample_body_bytes": round(statistics.mean(len(r.body) for r in samples)),
        "sample_wire_bytes": round(statistics.mean(wire_bytes(r) for r in samples)),
        "inventory_wire_bytes": round(statistics.mean(wire_bytes(r) for r in inventories)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        measured["nats_stored_bytes_per_message"] = round(asyncio.run(nats_stored_bytes(records, Path(tmp) / "n")))
        measured.update(warehouse_bytes_per_row(records, Path(tmp) / "w"))
    keep_s, cap = args.keep_min * 60, int(args.cap_mb * 2**20)
    rows = sheet(measured, keep_s, cap)
    if args.markdown:
        print(markdown(rows, keep_s, cap))
        print()
        print(json.dumps(measured))
    else:
        print(json.dumps({"measured": measured, "sheet": rows}))


if __name__ == "__main__":
    main()
