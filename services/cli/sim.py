"""`chamber sim`: replay a job trace under scheduling policies on a virtual clock and compare them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from services.cli.common import add_nats_option, finite_float
from services.cli.errors import UsageError

DEFAULT_TRACE = Path("data/traces/itp/jobs.csv")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sim", help="replay a job trace under scheduling policies and compare them")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help=f"trace CSV (default {DEFAULT_TRACE})")
    p.add_argument("--policy", default="chamber", help="fifo, static-quota or chamber (default chamber)")
    p.add_argument("--compare", metavar="P1,P2,...", help="run these policies side by side on the same trace")
    p.add_argument("--gpus", type=int, help="GPUs in the simulated fleet (with --from-warehouse: the recorded fleet)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (8; with --from-warehouse: the recorded most)")
    p.add_argument("--quotas", type=Path, help="TOML quota set (default: every team an equal share)")
    p.add_argument(
        "--until", type=finite_float, metavar="SECONDS", help="stop the clock this long after the first submit"
    )
    p.add_argument("--jobs", type=int, metavar="N", help="only the first N jobs of the trace")
    p.add_argument("--team", action="append", help="only this team's jobs (repeatable)")
    p.add_argument(
        "--fault-rate", type=finite_float, default=0.0, metavar="PER_NODE_DAY", help="node faults per node-day"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the fault generator")
    from services.tracesim import faults as fm

    p.add_argument(
        "--precursor-share",
        type=finite_float,
        default=fm.PRECURSOR_SHARE,
        metavar="0..1",
        help="with --fault-rate: share of node faults whose jobs slow down visibly before the node fails "
        f"(an assumption, default {fm.PRECURSOR_SHARE:g}); Chamber moves those jobs before the failure",
    )
    p.add_argument(
        "--precursor-lead",
        type=finite_float,
        default=fm.LEAD_S,
        metavar="SECONDS",
        help=f"with --fault-rate: how long before the failure the slowdown starts (default {fm.LEAD_S:g})",
    )
    p.add_argument(
        "--detection-delay",
        type=finite_float,
        default=fm.DETECTION_S,
        metavar="SECONDS",
        help=f"with --fault-rate: slowdown to move (default {fm.DETECTION_S:g}: bench/fabric.py's detection p99)",
    )
    p.add_argument(
        "--hang-timeout",
        type=finite_float,
        default=fm.HANG_S,
        metavar="SECONDS",
        help=f"with --fault-rate: a job whose node fails hangs this long before it is restarted (default "
        f"{fm.HANG_S:g}: the NCCL timeout)",
    )
    p.add_argument(
        "--checkpoint-default",
        type=finite_float,
        default=fm.CHECKPOINT_S,
        metavar="SECONDS",
        help=f"with --fault-rate: checkpoint interval of jobs whose trace row has none (default "
        f"{fm.CHECKPOINT_S:g}; 0: they lose all their work)",
    )
    p.add_argument(
        "--classes",
        nargs="?",
        const="default",
        metavar="MIX",
        help="give the jobs priority classes drawn at random (seeded): 'default' is "
        "critical=0.1,high=58,normal=1.5,low=40.5, or any class=weight,... (weights are normalised)",
    )
    p.add_argument(
        "--preemptible-classes",
        default="low",
        metavar="C1,C2",
        help="with --classes: the classes whose jobs are preemptible, or 'none' (default low)",
    )
    p.add_argument("--class-seed", type=int, default=0, help="with --classes: seed of the class draw (default 0)")
    from services.scheduler.policy_options import add_preemption_worth_argument

    add_preemption_worth_argument(p, default=None)  # for the chamber policy; unset: the service's default
    from services.tracesim.run import add_fair_share_argument

    add_fair_share_argument(p)
    p.add_argument("--strict", action="store_true", help="refuse the trace at its first bad row")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="draw utilization and queue length over time")
    p.add_argument(
        "--from-warehouse",
        action="store_true",
        help="what-if: replay the jobs recorded in the warehouse under the recorded quotas (current) "
        "and under --quotas (proposed)",
    )
    p.add_argument("--since", default="7d", help="with --from-warehouse: jobs submitted this long ago (7d)")
    add_nats_option(p)
    from services.warehouse.options import add_warehouse_options

    add_warehouse_options(p)
    p.set_defaults(func=run)
    from services.cli.sim_place import register_place

    register_place(p.add_subparsers(dest="sim_command", metavar="{place}", required=False))


def run(args: argparse.Namespace) -> int:
    if args.from_warehouse:
        from services.cli.sim_whatif import run_whatif

        return run_whatif(args)
    if args.gpus is None:
        raise UsageError("--gpus is required: the number of GPUs in the simulated fleet (e.g. --gpus 512)")
    if args.gpus_per_node is None:
        args.gpus_per_node = 8
    from services.tracesim.engine import FleetSpec
    from services.tracesim.quotas import equal_shares, load_quotas
    from services.tracesim.run import POLICIES, compare
    from services.tracesim.trace import TraceError, load

    policies = [p.strip() for p in (args.compare or args.policy).split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        flag = "--compare" if args.compare else "--policy"
        raise UsageError(f"{flag}: unknown policy {', '.join(unknown)}; use {', '.join(POLICIES)}")
    if args.gpus < 1 or args.gpus_per_node < 1:
        raise UsageError("--gpus and --gpus-per-node must be at least 1")
    if args.fault_rate < 0:
        raise UsageError("--fault-rate must be 0 or more faults per node-day")
    fault_model = _fault_model(args) if args.fault_rate > 0 else None
    try:
        trace = load(args.trace, strict=args.strict, limit=args.jobs if not args.team else None)
        jobs = [j for j in trace.jobs if not args.team or j.team in args.team]
        if args.jobs and args.team:
            jobs = jobs[: args.jobs]
        if not jobs:
            raise UsageError(f"{args.trace}: no jobs to simulate (check --team / --jobs)")
        classes = None
        if args.classes:
            from services.tracesim.classes import DEFAULT_MIX, assign, parse_mix

            mix_text = DEFAULT_MIX if args.classes == "default" else args.classes
            classes = parse_mix(mix_text, args.preemptible_classes, args.class_seed)
            jobs = assign(jobs, classes)
        teams = sorted({j.team for j in jobs})
        quotas = load_quotas(args.quotas, teams, args.gpus) if args.quotas else equal_shares(teams, args.gpus)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    for bad in trace.bad_rows[:20]:
        print(f"chamber sim: warning: {args.trace}:{bad.line}: skipped: {bad.problem}", file=sys.stderr)
    if len(trace.bad_rows) > 20:
        print(f"chamber sim: warning: ... and {len(trace.bad_rows) - 20} more bad rows skipped", file=sys.stderr)
    fleet = FleetSpec(gpus=args.gpus, gpus_per_node=args.gpus_per_node)
    options = sim_options(args)
    from services.scheduler.policy_options import chamber_tuning

    tuning = chamber_tuning(args)
    result, outcomes = compare(jobs, fleet, quotas, policies, tuning, fault_model=fault_model, **options)
    if fault_model is not None:
        from services.tracesim.run import fault_savings

        result["faults"] = fault_savings(
            jobs, fleet, quotas, policies[-1], outcomes[policies[-1]], fault_model, options, tuning
        )
    result["trace"] = {"file": str(args.trace), "jobs": len(jobs), "bad_rows": len(trace.bad_rows), "teams": len(teams)}
    if classes is not None:
        result["trace"]["classes"] = classes.describe()
    result["fleet"] = {"gpus": fleet.gpus, "gpus_per_node": fleet.gpus_per_node, "nodes": fleet.nodes}
    if tuning:
        result["chamber_tuning"] = tuning
    result["fair_share_factor"] = args.fair_share
    if args.plot:
        from services.tracesim.plot import plot

        title = f"{args.trace.name}: {len(jobs)} jobs on {fleet.gpus} GPUs"
        plot(outcomes, args.plot, title)
    show(args, result)
    return 0


def sim_options(args: argparse.Namespace) -> dict[str, Any]:
    """The simulation options of the command line, the same for a trace replay and a what-if."""
    return {
        "fault_rate_per_node_day": args.fault_rate,
        "seed": args.seed,
        "until": args.until,
        "fair_share": args.fair_share,
    }


def _fault_model(args: argparse.Namespace) -> Any:
    from services.tracesim.faults import FaultModel

    try:
        return FaultModel(
            precursor_share=args.precursor_share,
            lead_s=args.precursor_lead,
            detection_s=args.detection_delay,
            hang_s=args.hang_timeout,
            checkpoint_s=args.checkpoint_default,
        )
    except ValueError as exc:
        flags = {"lead_s": "--precursor-lead", "detection_s": "--detection-delay", "hang_s": "--hang-timeout"}
        flags |= {"checkpoint_s": "--checkpoint-default", "the precursor share": "--precursor-share"}
        text = str(exc)
        for name, flag in flags.items():
            text = text.replace(name, flag)
        raise UsageError(text) from None


def show(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
        if "faults" in result:
            print(fault_table(result["faults"]))
        if args.plot:
            print(f"plot written to {args.plot}")


ROWS = (
    ("utilization", "GPU utilization (allocated)", "{:.1%}"),
    ("utilization_while_submitting", "  while jobs arrive", "{:.1%}"),
    ("wait_mean_s", "queueing delay mean (h)", "h"),
    ("wait_p50_s", "queueing delay p50 (h)", "h"),
    ("wait_p95_s", "queueing delay p95 (h)", "h"),
    ("wait_p99_s", "queueing delay p99 (h)", "h"),
    ("jct_mean_s", "completion time mean (h)", "h"),
    ("jct_p50_s", "completion time p50 (h)", "h"),
    ("jct_p99_s", "completion time p99 (h)", "h"),
    ("makespan_s", "makespan (days)", "d"),
    ("jain_fairness", "Jain fairness (entitlement)", "{:.3f}"),
    ("preemptions", "preemptions", "{:,}"),
    ("requeues", "requeues after faults", "{:,}"),
    ("lost_gpu_hours", "GPU-hours lost (preempt+fault)", "{:,.0f}"),
    ("lost_to_faults_gpu_hours", "  of which to node faults", "{:,.0f}"),
    ("stranded_gpu_hours", "stranded GPU-hours", "{:,.0f}"),
    ("jobs_completed", "jobs completed", "{:,}"),
    ("jobs_unfinished", "jobs never finished", "{:,}"),
)


def _fmt(value: Any, how: str) -> str:
    if how == "h":
        return f"{value / 3600:,.2f}"
    if how == "d":
        return f"{value / 86400:,.1f}"
    return how.format(value)


def table(result: dict[str, Any]) -> str:
    policies = result["policies"]
    names = list(policies)
    width = max(len(label) for _, label, _ in ROWS)
    lines = [f"{'metric':<{width}}  " + "  ".join(f"{n:>14}" for n in names)]
    for key, label, how in ROWS:
        lines.append(f"{label:<{width}}  " + "  ".join(f"{_fmt(policies[n][key], how):>14}" for n in names))
    classes = [p for p in PRIORITY_ORDER if any(p in policies[n]["by_priority"] for n in names)]
    if len(classes) > 1 or "fifo" in names:
        lines.append("")
        lines.append(f"{'per class (wait in h)':<{width}}  " + "  ".join(f"{n:>14}" for n in names))
        for prio in classes:
            rows = [policies[n]["by_priority"].get(prio) for n in names]
            lines.append(f"{prio + ': jobs':<{width}}  " + "  ".join(f"{r['jobs'] if r else '-':>14}" for r in rows))
            lines.append(f"{'  wait mean / p50 / p99':<{width}}  " + "  ".join(f"{_waits(r):>14}" for r in rows))
            # a preempted job waits again until it runs again: the first wait alone does not show it
            lines.append(f"{'  queued in all mean / p99':<{width}}  " + "  ".join(f"{_queued(r):>14}" for r in rows))
            if "fifo" in names:
                lines.append(
                    f"{'  ratio to fifo (mean / p99)':<{width}}  " + "  ".join(f"{_ratios(r):>14}" for r in rows)
                )
    return "\n".join(lines)


def fault_table(faults: dict[str, Any]) -> str:
    p, w, m = faults["proactive"], faults["waiting_run"], faults["model"]
    return "\n".join(
        [
            "",
            f"node faults ({faults['policy']}): {faults['faults']} planned, {faults['precursors']} with a precursor "
            f"(share {m['precursor_share']:g}, lead {m['precursor_lead_s']:g} s, detected in {m['detection_s']:g} s)",
            f"  moving jobs on the precursor:  {p['lost_to_faults_gpu_hours']:,.0f} GPU-hours lost "
            f"({p['fault_moves']:,} moves, {p['requeues']:,} requeues, {p['hang_gpu_hours']:,.0f} GPU-h hung)",
            f"  the same faults, waiting:      {faults['waiting_same_faults_gpu_hours']:,.0f} GPU-hours lost "
            f"(NCCL timeout {m['hang_timeout_s']:g} s)",
            f"  GPU-hours saved by proactive moves: {faults['saved_gpu_hours']:,.0f}",
            f"  a separate run that waits:     {w['lost_to_faults_gpu_hours']:,.0f} GPU-hours lost "
            f"({w['requeues']:,} requeues; its schedule, so which jobs the faults hit, diverges)",
        ]
    )


PRIORITY_ORDER = ("critical", "high", "normal", "low")


def _waits(row: dict[str, Any] | None) -> str:
    if not row:
        return "-"
    return "/".join(f"{row[k] / 3600:.1f}" for k in ("wait_mean_s", "wait_p50_s", "wait_p99_s"))


def _queued(row: dict[str, Any] | None) -> str:
    if not row or "queued_mean_s" not in row:
        return "-"
    return "/".join(f"{row[k] / 3600:.1f}" for k in ("queued_mean_s", "queued_p99_s"))


def _ratios(row: dict[str, Any] | None) -> str:
    ratio = (row or {}).get("ratio_to_fifo")
    if not ratio:
        return "-"
    return " / ".join("n/a" if ratio[k] is None else f"{ratio[k]:.2f}" for k in ("mean", "p99"))
