"""`chamber sim --from-warehouse --since 7d --quotas NEW.toml`: the recorded jobs of a window replayed
by the chamber policy twice, under the quota set recorded then (`current`) and under NEW.toml
(`proposed`), compared in the same table and JSON as `--compare`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from services.cli.errors import UsageError


def run_whatif(args: argparse.Namespace) -> int:
    from services.tracesim.engine import FleetSpec
    from services.tracesim.history import load_history, one_model, parse_since
    from services.tracesim.quotas import TeamQuota, equal_shares, load_quotas
    from services.tracesim.run import compare
    from services.tracesim.trace import TraceError
    from services.warehouse.access import read_query

    if args.compare or args.policy != "chamber":
        raise UsageError("--from-warehouse compares the chamber policy under two quota sets; drop --compare/--policy")
    if not args.quotas:
        raise UsageError("--from-warehouse needs --quotas NEW.toml: the proposed quota set to compare with")
    if args.fault_rate < 0:
        raise UsageError("--fault-rate must be 0 or more faults per node-day")

    def query(sql: str) -> tuple[list[list[Any]], bool]:
        answer = read_query(args, sql, max_rows=10_000)
        return answer["rows"], bool(answer.get("truncated"))

    try:
        window = parse_since(args.since)
        end = time.time()
        history = load_history(query, end - window, end)
        jobs = history.loaded.jobs
        if args.team:
            jobs = [j for j in jobs if j.team in args.team]
            if not jobs:
                raise TraceError(f"no recorded jobs of team(s) {', '.join(args.team)} in the window; check --team")
        gpus = args.gpus or history.fleet_gpus
        if not gpus or gpus < 1:
            raise TraceError("the warehouse holds no GPU inventory; pass --gpus N for the fleet size")
        per_node = args.gpus_per_node or history.gpus_per_node or 8
        teams = sorted({j.team for j in jobs})
        notes = list(history.loaded.notes)
        model = history.gpu_model or FleetSpec.gpu_model
        jobs, other = one_model(jobs, model)
        if other:
            notes.append(f"{other} job(s) asked for a GPU model other than {model}: the simulated fleet is all {model}")
        if history.quotas:
            current = dict(history.quotas)
            for team in teams:  # teams with no recorded quota had no guarantee: they only borrowed
                current.setdefault(team, TeamQuota(team, "default", 0))
        else:
            current = equal_shares(teams, gpus)
            notes.append("no TeamQuotaSet recorded: current = every team an equal share")
        proposed = load_quotas(args.quotas, teams, gpus)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    fleet = FleetSpec(gpus=gpus, gpus_per_node=per_node, gpu_model=model)
    from services.cli.sim import sim_options

    options = sim_options(args)
    now_result, now_outcomes = compare(jobs, fleet, current, ["chamber"], **options)
    new_result, new_outcomes = compare(jobs, fleet, proposed, ["chamber"], **options)
    result: dict[str, Any] = {
        "policies": {"current": now_result["policies"]["chamber"], "proposed": new_result["policies"]["chamber"]},
        "window": {"since": args.since, "start": history.loaded.window_start, "end": history.loaded.window_end},
        "trace": {"source": "warehouse", **history.loaded.summary(), "jobs": len(jobs), "teams": len(teams)},
        "fleet": {"gpus": fleet.gpus, "gpus_per_node": fleet.gpus_per_node, "nodes": fleet.nodes, "gpu_model": model},
        "quotas": {"current": _quota_json(current), "proposed": _quota_json(proposed)},
        "notes": notes,
    }
    for note in notes:
        print(f"chamber sim: warning: {note}", file=sys.stderr)
    if args.plot:
        from services.tracesim.plot import plot

        outcomes = {"current": now_outcomes["chamber"], "proposed": new_outcomes["chamber"]}
        plot(outcomes, args.plot, f"recorded {args.since}: {len(jobs)} jobs on {fleet.gpus} GPUs")
    from services.cli.sim import show

    if not args.json:
        print(f"{len(jobs)} recorded jobs of the last {args.since} on {fleet.gpus} GPUs: current vs {args.quotas}")
    show(args, result)
    return 0


def _quota_json(quotas: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        t: {"pool": q.pool, "guaranteed": q.guaranteed, "borrow_limit": q.borrow_limit, "weight": q.weight}
        for t, q in sorted(quotas.items())
    }
