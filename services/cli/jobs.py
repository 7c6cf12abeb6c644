"""`chamber submit`, `chamber cancel`, `chamber queue`, `chamber explain`: work and the queue."""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import time
from typing import Any

from services.cli.common import add_nats_option, finite_float, send_command
from services.cli.errors import UsageError
from services.cli.model_check import warn_unknown_model
from services.cli.tables import table


def _send(args: argparse.Namespace, service: str, verb: str, payload: dict[str, Any]) -> Any:
    """send_command, with logs on stderr: stdout carries only the answer (scripts parse it)."""
    from services.runtime.logs import configure_logging

    configure_logging("error")
    return send_command(args, service, verb, payload)


PRIORITIES = ("critical", "high", "normal", "low")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="submit a job (a gang of --replicas x --gpus GPUs); prints its id")
    add_nats_option(p)
    p.add_argument("--team", required=True)
    p.add_argument("--gpus", type=int, help="GPUs per replica (with a share: 1, the default)")
    p.add_argument(
        "--gpu-milli",
        type=int,
        metavar="N",
        help="a fraction of one GPU per replica: N milli-GPU of its compute (1..1000); quotas count N/1000 GPUs",
    )
    p.add_argument(
        "--gpu-memory", type=int, metavar="MIB", help="with --gpu-milli: the GPU memory each replica needs, in MiB"
    )
    p.add_argument(
        "--share-mode",
        choices=("time-slicing", "mps"),
        help="how a fraction shares its GPU (default time-slicing); different modes never share a GPU",
    )
    p.add_argument(
        "--mig-profile",
        metavar="PROFILE",
        help="one MIG instance per replica (e.g. 1g.10gb); quotas count its share of the GPU",
    )
    p.add_argument(
        "--cpu", type=finite_float, metavar="CPUS", help="CPUs each replica needs of its node (e.g. 8 or 0.5)"
    )
    p.add_argument("--memory", type=int, metavar="MIB", help="host memory each replica needs of its node, in MiB")
    p.add_argument("--replicas", type=int, default=1, help="replicas, placed all or nothing (default 1)")
    p.add_argument("--priority", default="normal", choices=PRIORITIES)
    p.add_argument(
        "--gpu-model",
        help="run only on this GPU model, as `chamber fleet` names it (e.g. H100-80GB; case does not matter)",
    )
    p.add_argument(
        "--preemptible",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="may be suspended for more urgent work and resumed later (default yes)",
    )
    p.add_argument("--checkpoint-interval", type=finite_float, metavar="S", help="seconds between checkpoints")
    p.add_argument("--name", default="")
    p.add_argument("--id", help="job id (default: derived from the name, unique)")
    p.add_argument(
        "--request-id",
        metavar="ID",
        help="this request's id (default: a new one, printed if the answer does not come): "
        "running the command again with the same one submits the job once",
    )
    p.add_argument("--pool", help="pool to run in (default: the team's pool)")
    p.add_argument("--expected-duration", type=finite_float, metavar="S", help="runtime estimate, for backfill")
    p.add_argument(
        "--sim-duration", type=finite_float, metavar="S", help="simulated fleet: complete after S seconds of running"
    )
    p.add_argument("--cluster", help="run within this cluster only (default: any one cluster)")
    p.add_argument(
        "--allow-wait",
        action="store_true",
        help="keep a job that cannot run on the fleet as installed (no GPU of its model, larger than the fleet "
        "or than its team may hold) waiting instead of refusing it",
    )
    p.add_argument("--json", action="store_true", help='print {"id": ...}')
    p.set_defaults(func=submit)

    p = sub.add_parser("cancel", help="cancel a job")
    add_nats_option(p)
    p.add_argument("job")
    p.add_argument("--reason", default="")
    p.set_defaults(func=cancel)

    p = sub.add_parser("queue", help="pending, suspended and running jobs, in queue order, with reasons")
    add_nats_option(p)
    p.add_argument("--all", action="store_true", help="include finished jobs")
    p.add_argument(
        "--limit", type=int, metavar="N", help="show at most N jobs (default: all, fetched a page at a time)"
    )
    p.add_argument("--offset", type=int, default=0, metavar="N", help="skip the first N jobs (default 0)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=queue)

    p = sub.add_parser("explain", help="why a job is pending, where it runs, or why it was preempted")
    add_nats_option(p)
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=explain)


def _positive(value: float | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be above 0, got {value:g}")


def submit(args: argparse.Namespace) -> int:
    payload = submit_payload(args)
    try:
        result = _send(args, "scheduler", "submit", payload)
    except UsageError as exc:
        if args.request_id is None and "start it with" in str(exc):  # no answer: it may have been applied
            raise UsageError(
                f"{exc}; to retry without submitting twice: --request-id {payload['request_id']}"
            ) from None
        raise
    for warning in result.get("warnings", []):
        print(f"chamber submit: warning: {warning}", file=sys.stderr)
    print(json.dumps({"id": result["id"]}) if args.json else result["id"])
    if not result.get("warnings"):  # the scheduler checks the model against its fleet; older ones did not
        warn_unknown_model(args, args.gpu_model, f"job {result['id']}")
    return 0


def submit_payload(args: argparse.Namespace) -> dict[str, Any]:
    """The `submit` request `chamber submit`'s options make (UsageError for options it refuses itself)."""
    shared = any(v is not None for v in (args.gpu_milli, args.gpu_memory, args.share_mode, args.mig_profile))
    if args.gpus is None and not shared:
        raise UsageError("how many GPUs per replica? pass --gpus N, or a share (--gpu-milli N, --mig-profile P)")
    if args.gpus is not None and args.gpus < 1:
        raise UsageError(f"--gpus must be 1 or more, got {args.gpus}")
    if args.replicas < 1:
        raise UsageError(f"--replicas must be 1 or more, got {args.replicas}")
    _positive(args.checkpoint_interval, "--checkpoint-interval")
    _positive(args.expected_duration, "--expected-duration")
    _positive(args.cpu, "--cpu")
    _positive(args.memory, "--memory")
    if args.sim_duration is not None and args.sim_duration < 0:
        raise UsageError(f"--sim-duration must be 0 or more, got {args.sim_duration:g}")
    payload: dict[str, Any] = {
        "team": args.team,
        "gpus": args.gpus if args.gpus is not None else 1,
        "replicas": args.replicas,
        "priority": args.priority,
        "name": args.name,
        "preemptible": args.preemptible,
    }
    if args.allow_wait:
        payload["allow_wait"] = True
    optional = {
        "id": args.id,
        "pool": args.pool,
        "cluster": args.cluster,
        "gpu_model": args.gpu_model,
        "checkpoint_interval_s": args.checkpoint_interval,
        "expected_duration_s": args.expected_duration,
        "sim_duration_s": args.sim_duration,
        "gpu_milli": args.gpu_milli,
        "gpu_memory_mib": args.gpu_memory,
        "share_mode": args.share_mode,
        "mig_profile": args.mig_profile,
        "cpu_milli": None if args.cpu is None else round(args.cpu * 1000),
        "memory_mib": args.memory,
    }
    payload.update({k: v for k, v in optional.items() if v is not None})
    payload["request_id"] = args.request_id or secrets.token_hex(8)
    return payload


def cancel(args: argparse.Namespace) -> int:
    result = _send(args, "scheduler", "cancel", {"job": args.job, "by": "cli", "reason": args.reason})
    print(f"{result['id']} cancelled")
    return 0


def _queue_pages(args: argparse.Namespace) -> dict[str, Any]:
    """Every job asked for, a page at a time: one reply stays under NATS's max payload."""
    if args.offset < 0 or (args.limit is not None and args.limit < 1):
        raise UsageError("--offset must be 0 or more and --limit 1 or more")
    request: dict[str, Any] = {"all": args.all, "offset": args.offset}
    jobs: list[dict[str, Any]] = []
    while True:
        if args.limit is not None:
            request["limit"] = args.limit - len(jobs)
        page = _send(args, "scheduler", "queue", request)
        jobs.extend(page["jobs"])
        nxt = page.get("next_offset")
        if nxt is None or (args.limit is not None and len(jobs) >= args.limit) or not page["jobs"]:
            return {"jobs": jobs, "total": page.get("total", len(jobs))}
        request["offset"] = nxt


def queue(args: argparse.Namespace) -> int:
    result = _queue_pages(args)
    if args.json:
        print(json.dumps(result))
        return 0
    jobs = result["jobs"]
    if not jobs:
        print("no jobs")
        return 0
    print(queue_text(jobs))
    return 0


def queue_text(jobs: list[dict[str, Any]]) -> str:
    """The queue in the order the scheduler's next cycle takes it (POS), with the factors behind it;
    then, apart, the jobs kept with --allow-wait that cannot run as specified."""
    blocked = [j for j in jobs if j.get("cannot_run")]
    listed = [j for j in jobs if not j.get("cannot_run")]
    header = ("POS", "ID", "TEAM", "PRIORITY", "GPUS", "STATE", "SCORE", "AGE", "GUARD", "REASON / PLACEMENT")
    text = [table(header, [_queue_row(j) for j in listed], align="rlllrlrrll") if listed else "no jobs that can run"]
    if blocked:
        text.append(
            f"\ncannot run as specified ({len(blocked)}; kept with --allow-wait until the fleet or quota changes):"
        )
        rows = [(j["id"], j["team"], _gpus(j), "; ".join(j["cannot_run"])) for j in blocked]
        text.append(table(("ID", "TEAM", "GPUS", "WHY"), rows, align="llrl"))
    return "\n".join(text)


def _gpus(j: dict[str, Any]) -> str:
    each = j.get("share") or str(j["gpus"])  # a share: "250 milli-GPU (time-slicing)", "1g.10gb MIG instance"
    return f"{j['replicas']}x{each}" if j["replicas"] > 1 else each


def _queue_row(j: dict[str, Any]) -> tuple[str, ...]:
    where = " ".join(f"{n}[{','.join(map(str, g))}]" for n, g in j["placement"].items())
    detail = where if j["state"] == "running" else j["reason"]
    score = "-" if j.get("priority_score") is None else f"{j['priority_score']:.0f}"
    age = "-" if j.get("age_s") is None else _duration(j["age_s"])
    return (str(j.get("position") or "-"), j["id"], j["team"], j["priority"], _gpus(j), j["state"], score, age,
            _guard(j), detail)  # fmt: skip


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _guard(row: dict[str, Any]) -> str:
    """The starvation guard: on (protected: later jobs may not delay it), or how long until it is."""
    if row.get("protected"):
        return "on"
    since, now_age = row.get("protected_since"), row.get("age_s")
    if since is None or now_age is None or row.get("queued_since") is None:
        return "-"
    return "in " + _duration(max(since - row["queued_since"] - now_age, 0.0))


def explain(args: argparse.Namespace) -> int:
    result = _send(args, "scheduler", "explain", {"job": args.job})
    slowdown = _slowdown_lines(args)
    if args.json:
        print(json.dumps({**result, "slowdown": slowdown}) if slowdown else json.dumps(result))
        return 0
    print(result["text"])
    now = time.time()
    for line in slowdown:
        print(f"  perf: {human_times(line, now)}")
    return 0


_EPOCH = re.compile(r"\b1\d{9}(?:\.\d+)?\b")  # epoch seconds from 2001 to 2286, as the perf service writes them


def human_times(line: str, now: float) -> str:
    """The perf service's history lines carry epoch seconds (`1796239017: slow ...`): for people,
    an ISO time and how long ago. The service's JSON keeps the epochs."""
    from services.timefmt import when

    return _EPOCH.sub(lambda m: when(float(m.group()), now), line)


def _slowdown_lines(args: argparse.Namespace) -> list[str]:
    """The perf service's account of the job's slowdowns (none when that service is not running)."""
    try:
        return list(_send(args, "perf", "explain", {"job": args.job}).get("lines", []))
    except UsageError:
        return []
