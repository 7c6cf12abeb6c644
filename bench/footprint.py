"""Memory of the demo: RSS and PSS of every process `chamber up` starts (the 16-node demo by default).

    python bench/footprint.py [--nodes 16] [--settle 30] [--code DIR]

Starts `chamber up` on free ports in a temporary data directory, waits until it is up and `--settle`
seconds more (the services fold, the workload submits, the recorder stores), reads each process's
memory from /proc (`VmRSS`; `Pss` from smaps_rollup, which splits shared pages between the processes
that share them, so PSS adds up to what the demo really uses), stops the stack, and prints one JSON
object: per process its name, RSS and PSS in MB, and the totals. `--code DIR` runs another checkout
(a before/after comparison on the same machine).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc: each process's parent)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in kB; (0, 0) if the process is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def name_of(pid: int) -> str:
    """`chamber service quota` -> `quota`; the agent, the workload, nats-server by their command."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if "service" in words:
        return words[words.index("service") + 1]
    for known in ("agent", "workload"):
        if known in words:
            return known
    return Path(words[0]).name if words else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds to run once up before measuring")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout to run (default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chamber-footprint-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")}
        env["PYTHONPATH"] = str(args.code)
        cmd = [sys.executable, "-m", "services.cli", "up", "--data-dir", f"{tmp}/data", "--nodes", str(args.nodes)]
        cmd += ["--port", str(free_port()), "--nats-port", str(free_port())]
        log = open(f"{tmp}/up.log", "w")  # noqa: SIM115 (open for the life of the process)
        up = subprocess.Popen(cmd, cwd=args.code, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while "chamber is up" not in Path(f"{tmp}/up.log").read_text():
                if up.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("chamber up did not come up:\n" + Path(f"{tmp}/up.log").read_text())
                time.sleep(0.5)
            time.sleep(args.settle)
            rows = []
            for pid in [up.pid, *children(up.pid)]:
                rss, pss = memory_kb(pid)
                if rss:
                    rows.append({"process": "up" if pid == up.pid else name_of(pid), "rss_mb": round(rss / 1024, 1),
                                 "pss_mb": round(pss / 1024, 1)})  # fmt: skip
        finally:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
            log.close()
    rows.sort(key=lambda r: -r["pss_mb"])
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "settle_s": args.settle,
                "processes": rows,
                "total_rss_mb": round(sum(r["rss_mb"] for r in rows), 1),
                "total_pss_mb": round(sum(r["pss_mb"] for r in rows), 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
