"""Runtime throughput on this machine: JetStream publish (batched acks), and consume rates measured
side by side for this checkout and, with `--before DIR`, another (e.g. the commit before a change:
`git archive <commit> | tar -x -C DIR`).

Starts its own nats-server in a temp dir and fills it once: `--messages` 8-GPU node samples (~3 KiB
of JSON) on TELEMETRY, and `--jobs` finished jobs (submitted, scheduled, completed: small JOBS events)
plus a small fleet and quotas. Then, `--rounds` times, alternating the checkouts so both see the same
machine load, `bench/consume_once.py` measures in its own process:
- `domain_events`: the scheduler's manifest on the decider host folding everything from the start
  until caught up (batched pull, merge across the inputs, decode, `evolve`);
- `node_samples`: a runtime Consumer (batched pull, decode, handler and ack per message).
Prints one JSON object per run, then one summary per measure: best and median of the wall-clock rate
and of the rate per CPU second of the consuming process (steadier on a shared machine; on a quiet one
the two meet), and their ratio against `--before`.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import encode
from services.runtime import Publisher, connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from tests.builders import a_node_sample

ROOT = Path(__file__).resolve().parents[1]
MEASURES = ("domain_events", "node_samples")


async def publish_samples(url: str, n: int) -> dict[str, object]:
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    samples = [a_node_sample(f"n{i % 64:02d}", seq=i) for i in range(n)]
    size = len(encode(samples[0], source="bench")[1])
    publisher = Publisher(js, source="bench")
    t0 = time.perf_counter()
    await publisher.publish_many((s, f"{s.node}:{s.seq}", s.observed_at) for s in samples)
    publish_s = time.perf_counter() - t0
    await nc.drain()
    return {
        "measure": "node_samples_publish",
        "messages": n,
        "message_bytes": size,
        "publish_msgs_per_s": round(n / publish_s),
        "publish_mb_per_s": round(n * size / publish_s / 1e6, 1),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def consume_once(code: Path, server: NatsServerProcess, measure: str, batch: int) -> dict[str, object]:
    """One run in its own process; `server_cpu_us_per_event`: the nats-server's CPU over the run (all of
    it, the consumer's start included) per event, to see which side bounds a quiet 2-core machine."""
    assert server.proc is not None
    cmd = [sys.executable, str(ROOT / "bench" / "consume_once.py"), "--code", str(code), "--url", server.url]
    server_cpu = cpu_seconds(server.proc.pid)
    out = subprocess.run([*cmd, "--measure", measure, "--batch", str(batch)], capture_output=True, text=True)
    server_cpu = cpu_seconds(server.proc.pid) - server_cpu
    if out.returncode != 0:
        raise SystemExit(f"consume_once failed for {code}:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["server_cpu_us_per_event"] = round(server_cpu * 1e6 / int(result["events"]), 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000, help="node samples on TELEMETRY")
    parser.add_argument("--batch", type=int, default=500, help="the node-sample consumer's batch")
    parser.add_argument("--jobs", type=int, default=20_000, help="finished jobs (x3 events) for the fold")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout to measure side by side")
    args = parser.parse_args()
    configure_logging("error", json=True)
    from bench.restart import fill

    codes = [("before", args.before.resolve())] if args.before else []
    codes.append(("after", ROOT))
    runs: dict[tuple[str, str], list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp, NatsServerProcess(Path(tmp) / "js") as server:
        print(json.dumps(asyncio.run(publish_samples(server.url, args.messages))), flush=True)
        asyncio.run(fill(server.url, args.jobs, nodes=50))
        for _ in range(args.rounds):
            for measure in MEASURES:
                for label, code in codes:
                    result = {"run": label, **consume_once(code, server, measure, args.batch)}
                    runs.setdefault((measure, label), []).append(result)
                    print(json.dumps(result), flush=True)
    for measure in MEASURES:
        summary: dict[str, object] = {"summary": measure, "rounds": args.rounds}
        metrics = [m for m in ("events_per_s", "events_per_cpu_s", "steady_events_per_s", "steady_events_per_cpu_s")]
        for metric in [m for m in metrics if m in runs[(measure, codes[0][0])][0]]:
            values = {label: [int(r[metric]) for r in runs[(measure, label)]] for label, _ in codes}
            best = {label: max(v) for label, v in values.items()}  # the least disturbed run
            median = {label: statistics.median(v) for label, v in values.items()}
            summary[f"{metric}_best"], summary[f"{metric}_median"] = best, median
            if args.before:
                summary[f"{metric}_ratio_best"] = round(best["after"] / best["before"], 2)
                summary[f"{metric}_ratio_median"] = round(median["after"] / median["before"], 2)
        summary["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
