"""Idle reclaim on the decider host, in the perf service's process (`chamber service perf`).

Perf already follows what idle reclaim needs: JOBS from the start (placements, teams, ends) and the
fresh TELEMETRY samples and fabric samples (per-GPU SM activity, used memory, NCCL RAS counts), in
the host's "new" mode (no telemetry is replayed: a job is judged only on what was watched since the
process started, services/idle/core.py). This decider adds QUOTA's idle policies (`chamber.quota.
<team>.idle`) and publishes one JobIdleDetected per job run (`chamber.jobs.<job>.idle`) once its
team's policy says it is idle; the scheduler suspends it when the action is `suspend`.

Commands (under perf's: `chamber.cmd.perf.<verb>`): `idle_policy` sets a team's policy (a pure
validation; the policy is the IdlePolicySet it records), `idle` answers the policies and the flags.
"""

from __future__ import annotations

from typing import Any

from events import Event
from events.codec import stable_id
from events.commands import NoArguments, SetIdlePolicy
from events.idle import IdlePolicySet
from services.idle import core
from services.runtime.commands import Accepted, Append, Command
from services.runtime.decider import Decider, DeciderHost, Input
from services.runtime.host import ServiceContext
from services.runtime.logs import get_logger

DECIDER = "idle"  # the decider's name (its log lines); its commands are served under the perf service
READS = ("JOBS", "QUOTA", "TELEMETRY")
PUBLISHES = ("chamber.jobs.*.idle", "chamber.quota.*.idle")
log = get_logger("chamber.idle")


def decide(state: core.IdleState, now: float) -> list[tuple[Event, str]]:
    out: list[tuple[Event, str]] = []
    for v in core.decide(state, now):
        event = core.event_of(v)
        # one verdict per run of the job: a replica or a restart deciding it again is de-duplicated
        out.append((event, stable_id("idle", v.job_id, state.jobs[v.job_id].started)))
        log.info("job idle", job=v.job_id, team=v.team, action=event.action, since=v.idle_since)
    return out


def manifest(telemetry: list[tuple[str, str]], tick_s: float = 5.0) -> Decider[core.IdleState]:
    live = tuple(Input(stream, (subject,), deliver="new") for stream, subject in telemetry)
    return Decider(
        name=DECIDER,
        inputs=(Input("JOBS"), Input("QUOTA", ("chamber.quota.*.idle",)), *live),
        initial=core.IdleState,
        evolve=core.evolve,
        decide=decide,
        tick_s=tick_s,
        commands=COMMANDS,
    )


def validate_policy(state: core.IdleState, req: SetIdlePolicy, now: float) -> Accepted:
    event = IdlePolicySet(
        team=req.team,
        at=now,
        mode=req.mode,
        sm_below_pct=req.sm_below_pct,
        memory_tolerance_mib=req.memory_tolerance_mib,
        idle_minutes=req.idle_minutes,
        grace_minutes=req.grace_minutes,
        by=req.by,
    )
    policy = core.policy_of(event)
    append = Append(event, stable_id("idle-policy", req.team, now))
    return Accepted((append,), {"team": req.team, **policy_view(policy)})


def policy_view(p: core.IdlePolicy) -> dict[str, Any]:
    return {
        "mode": p.mode.value,
        "sm_below_pct": p.sm_below_pct,
        "memory_tolerance_mib": p.memory_tolerance_mib,
        "idle_minutes": p.idle_minutes,
        "grace_minutes": p.grace_minutes,
    }


def answer_idle(state: core.IdleState, _: NoArguments, now: float) -> dict[str, Any]:
    flagged = [
        {"job": job_id, "team": job.team, "gpus": job.gpus, "idle_since": job.last_work}
        for job_id, job in sorted(state.jobs.items())
        if job.flagged and job.placements
    ]
    policies = {team: policy_view(p) for team, p in sorted(state.policies.items())}
    return {"policies": policies, "default": policy_view(state.default), "flagged": flagged}


COMMANDS: tuple[Command[core.IdleState, Any], ...] = (
    Command("idle_policy", SetIdlePolicy, validate=validate_policy),
    Command("idle", NoArguments, answer=answer_idle),
)


def install(ctx: ServiceContext, telemetry: list[tuple[str, str]], tick_s: float) -> DeciderHost[core.IdleState]:
    """Host the idle decider on the perf service's context (perf's `--tick`); /readyz waits for both folds."""
    host = DeciderHost(manifest(telemetry, tick_s), ctx)
    perf_replaying = ctx.health_state.replaying if ctx.health_state is not None else None
    host.install()
    if ctx.health_state is not None and perf_replaying is not None:
        idle_replaying = host.replaying
        ctx.health_state.replaying = lambda: perf_replaying() or idle_replaying()
    return host
