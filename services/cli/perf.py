"""`chamber perf` and `chamber fabric`: what the job-performance service sees (commands to
`chamber service perf`): running jobs with verdict, culprit and evidence; per node NICs and flagged links."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from services.cli.common import add_nats_option, send_command


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "perf",
        help="running jobs (one rank or many): healthy or slow, the culprit and the evidence; jobs moved while slow",
    )
    add_nats_option(p)
    p.add_argument(
        "job",
        nargs="?",
        metavar="JOB",
        help="one job's view: per-rank GPU activity over time; `replay` replays a step table offline (--steps)",
    )
    p.add_argument("--json", action="store_true", help='print {"jobs": [...]} (with JOB: the heat) for scripts')
    r = p.add_argument_group("replay (chamber perf replay --steps FILE): no NATS, a virtual clock")
    r.add_argument("--steps", type=Path, metavar="FILE", help="per-rank step timings: .csv, .parquet or .jsonl")
    r.add_argument("--job", dest="replay_job", metavar="ID", help="replay only this job's rows")
    r.add_argument(
        "--gpus-per-node", type=int, default=8, metavar="N", help="without a node column: rank r on node r // N (8)"
    )
    p.set_defaults(func=run_perf)
    f = sub.add_parser("fabric", help="per node: NICs, link state, rate, traffic, error/pause rates, flagged links")
    add_nats_option(f)
    f.add_argument("--json", action="store_true", help='print {"nodes": [...]} for scripts')
    f.add_argument("--flagged", action="store_true", help="only nodes with a flagged link")
    f.set_defaults(func=run_fabric)


def _quiet() -> None:
    from services.runtime.logs import configure_logging

    configure_logging("error")


SHADES = " .:-=+*#%@"  # activity 0..100 % as one character per rank and time column


def run_perf(args: argparse.Namespace) -> int:
    _quiet()
    if args.job == "replay" or args.steps is not None:
        return _replay(args)
    if args.job:
        return _job_view(args)
    result: dict[str, Any] = send_command(args, "perf", "status", {})
    jobs = result.get("jobs", [])
    if args.json:
        print(json.dumps({"jobs": jobs}, indent=2))
        return 0
    if not jobs:
        print("no running jobs tracked yet")
        return 0
    width = max([24, *(len(j["job"]) for j in jobs)])  # a column, however long the job ids
    for j in jobs:
        where = "/".join(str(x) for x in (j.get("node"), j.get("leaf")) if x)
        gpus = j.get("gpus") or []
        part = f" gpu{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}" if gpus else ""
        part = part or (f" gpu {j['gpu']}" if j.get("gpu") is not None else "")
        part += f" nic {j['nic']}" if j.get("nic") else ""
        culprit = f"  culprit {j['culprit']} {where}{part}" if j.get("culprit") else ""
        culprit += f" ({j['pattern']})" if j.get("pattern") else ""
        score = "" if j.get("score") is None else f" score {j['score']:.2f}  ranks {j['ranks']}"
        print(f"{j['job']:<{width}} {j['verdict'].upper():<8}{score}{culprit}")
        for line in (j.get("evidence"), j.get("moved")):
            if line:
                print(f"   {line}")
    return 0


def run_fabric(args: argparse.Namespace) -> int:
    _quiet()
    result: dict[str, Any] = send_command(args, "perf", "fabric", {})
    nodes = [n for n in result.get("nodes", []) if not args.flagged or n["flagged"]]
    if args.json:
        print(json.dumps({"nodes": nodes}, indent=2))
        return 0
    if not nodes:
        print("no fabric samples yet" if not args.flagged else "no flagged links")
        return 0
    for n in nodes:
        print(f"{n['cluster']}/{n['node']}  leaf {n.get('leaf') or '-'}  pause/NIC/s {n['pause_per_nic_s']:g}")
        for nic in n["nics"]:
            rate = "-" if nic["rate_gbps"] is None else f"{nic['rate_gbps']:g}G"
            tx = "-" if nic["tx_gbps"] is None else f"{nic['tx_gbps']:g}"
            flags = ",".join(nic["flags"]) or "ok"
            print(
                f"   {nic['nic']:<10} {nic['state']:<5} {rate:>5}  tx {tx:>7} Gb/s  "
                f"err {nic['errors'] or 0:<5} pause {nic['pause'] or 0:<7} {flags}"
            )
    return 0


def _job_view(args: argparse.Namespace) -> int:
    heat: dict[str, Any] = send_command(args, "perf", "ranks", {"job": args.job})
    if args.json:
        print(json.dumps(heat, indent=2))
        return 0
    culprit = heat.get("culprit") or {}
    rows = heat["activity_pct"][-60:]  # the last 60 evaluations, oldest left
    print(
        f"{heat['job']}  {heat['verdict'].upper()}  GPU activity per rank, "
        f"last {len(rows)} samples (' ' 0 % .. '@' 100 %)"
    )
    for i, rank in enumerate(heat["ranks"]):
        line = "".join(_shade(r[i] if i < len(r) else None) for r in rows)
        mark = ""
        if culprit.get("node") == rank["node"] and culprit.get("gpu") == rank["gpu"]:
            mark = f"  <- culprit ({culprit['kind']}{' ' + culprit['nic'] if culprit.get('nic') else ''})"
        print(f"  {rank['node']:>12} gpu {rank['gpu']:<2} |{line}|{mark}")
    if culprit.get("kind") == "fabric":
        print(f"  culprit: shared congestion under {culprit.get('leaf')}")
    return 0


def _shade(value: float | None) -> str:
    if value is None:
        return "?"
    return SHADES[min(len(SHADES) - 1, max(0, int(value / 100 * (len(SHADES) - 1) + 0.5)))]


def _replay(args: argparse.Namespace) -> int:
    """`chamber perf replay --steps FILE`: the perf and health cores over a step table, offline."""
    from services.cli.errors import UsageError
    from services.perf.replay import StepTableError, parse_rows, read_table, replay, summary_lines

    if args.job not in (None, "replay"):
        raise UsageError("--steps goes with `chamber perf replay`, not with a job id")
    if args.steps is None:
        raise UsageError("chamber perf replay needs --steps FILE (a .csv, .parquet or .jsonl step table)")
    try:
        rows = parse_rows(read_table(args.steps), where=str(args.steps))
        result = replay(rows, job=args.replay_job, gpus_per_node=args.gpus_per_node)
    except StepTableError as err:
        raise UsageError(str(err)) from None
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print("\n".join(summary_lines(result)))
    return 0
