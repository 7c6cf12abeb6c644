"""`chamber idle` (idle-reclaim policies, jobs flagged idle, GPU-hours reclaimed per team), `chamber idle
policy TEAM --mode ...` (set a team's policy) and `chamber resume JOB` (queue again a job suspended as
idle). Commands to `chamber service perf` (the idle decider), `billing` and `scheduler`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import add_nats_option, send_command
from services.timefmt import iso


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("idle", help="idle reclaim: policies per team, jobs flagged idle, GPU-hours reclaimed")
    add_nats_option(p)
    p.add_argument("--json", action="store_true", help="print the answers as JSON for scripts")
    p.set_defaults(func=run_idle)
    verbs = p.add_subparsers(dest="idle_verb", metavar="VERB")
    pol = verbs.add_parser("policy", help="set a team's idle policy (replaced whole: unnamed settings default)")
    add_nats_option(pol)
    pol.add_argument("team", metavar="TEAM")
    pol.add_argument("--mode", choices=("off", "notify", "suspend"), required=True, help="what to do with idle jobs")
    pol.add_argument("--sm-below", type=float, default=5.0, metavar="PCT", help="SM activity counted idle (5)")
    pol.add_argument("--idle-minutes", type=float, default=30.0, metavar="MIN", help="how long idle (30)")
    pol.add_argument("--grace-minutes", type=float, default=15.0, metavar="MIN", help="never in the first (15)")
    pol.add_argument(
        "--memory-tolerance", type=float, default=64.0, metavar="MIB", help="memory moves below this are noise (64)"
    )
    pol.add_argument("--json", action="store_true", help="print the policy set as JSON")
    pol.set_defaults(func=run_policy)
    r = sub.add_parser("resume", help="queue again a job suspended as idle (it resumes when it fits)")
    add_nats_option(r)
    r.add_argument("job", metavar="JOB", help="its id, exact name or a unique id prefix")
    r.add_argument("--by", default="", help="who asks (recorded with the request)")
    r.set_defaults(func=run_resume)


def run_policy(args: argparse.Namespace) -> int:
    payload = {
        "team": args.team,
        "mode": args.mode,
        "sm_below_pct": args.sm_below,
        "idle_minutes": args.idle_minutes,
        "grace_minutes": args.grace_minutes,
        "memory_tolerance_mib": args.memory_tolerance,
    }
    from services.cli.quota import refuse_team_typo  # the quota command's module: loaded only here

    first = f"for a new team, set its quota first: chamber quota set {args.team} --gpus N --replace"
    refuse_team_typo(args, args.team, None, first, quota_needed=False)  # the policy is perf's
    result: dict[str, Any] = send_command(args, "perf", "idle_policy", payload)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"team {result['team']}: idle policy {_policy_line(result)}")
    return 0


def _policy_line(p: dict[str, Any]) -> str:
    return (
        f"{p['mode']} (idle: SM below {p['sm_below_pct']:g} %, memory within {p['memory_tolerance_mib']:g} MiB, "
        f"no collective progress, for {p['idle_minutes']:g} min; never in the first {p['grace_minutes']:g} min)"
    )


def run_idle(args: argparse.Namespace) -> int:
    status: dict[str, Any] = send_command(args, "perf", "idle", {})
    reclaimed: dict[str, Any] = send_command(args, "billing", "reclaimed", {})
    if args.json:
        print(json.dumps({**status, "reclaimed_gpu_hours_by_team": reclaimed["gpu_hours_by_team"]}, indent=2))
        return 0
    print(f"default: {_policy_line(status['default'])}")
    for team, policy in status["policies"].items():
        print(f"team {team}: {_policy_line(policy)}")
    flagged = status["flagged"]
    print(f"{len(flagged)} running job(s) flagged idle" + (":" if flagged else ""))
    width = max([24, *(len(j["job"]) for j in flagged)])
    for j in flagged:
        print(f"  {j['job']:<{width}} team {j['team']:<12} {j['gpus']} GPU(s), idle since {iso(j['idle_since'])}")
    hours = reclaimed["gpu_hours_by_team"]
    print("GPU-hours reclaimed: " + (", ".join(f"{t} {h:g}" for t, h in hours.items()) or "none yet"))
    return 0


def run_resume(args: argparse.Namespace) -> int:
    result: dict[str, Any] = send_command(args, "scheduler", "resume", {"job": args.job, "by": args.by})
    print(f"job {result['id']} queued again: it resumes from its checkpoint when it fits")
    return 0
