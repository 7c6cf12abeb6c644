"""Every decider core through the conformance suite (tests/conformance/harness.py), on logs that
the cores themselves produced: a fleet, quotas, submissions, faults, and the scheduler's own
decisions folded back as the host does."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import (
    Event,
    FaultKind,
    GpuFaultDetected,
    GpuIsolated,
    GpuRestored,
    GpuShare,
    JobCancelled,
    NodeForgotten,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    PoolDefined,
    Severity,
    ShareMode,
)
from events.fabric import CulpritKind, JobSlowdownCleared, JobSlowdownDetected
from services.billing import core as billing
from services.billing import service as billing_service
from services.gateway import core as gateway
from services.gateway import service as gateway_service
from services.quota import core as quota
from services.quota import service as quota_service
from services.scheduler import service as scheduler_service
from services.scheduler.core import SchedulerState, events_for, evolve, schedule
from tests.conformance.harness import (
    CoreSpec,
    canon,
    decide_only_reads,
    fold,
    interleavings_fold_to_one_state,
    no_reference_cycles,
    restart_mid_cycle,
    snapshot_restore_continue,
)
from tests.scheduler_builders import a_job, a_node, a_quota, done

TEAMS = ["a", "b", "c"]
SHARES = [
    GpuShare(gpu_milli=250),
    GpuShare(gpu_milli=500, memory_mib=20480, mode=ShareMode.MPS),
    GpuShare(mode=ShareMode.MIG, mig_profile="1g.10gb"),
    GpuShare(mode=ShareMode.MIG, mig_profile="3g.40gb"),
]
_codec = scheduler_service.snapshot_codec()


def _scheduler_decide(state: SchedulerState, now: float) -> list[tuple[Event, str]]:
    return events_for(schedule(state, now).decisions, now)


SCHEDULER = CoreSpec[SchedulerState](
    name="scheduler",
    initial=lambda: SchedulerState(retention_s=500.0),
    evolve=evolve,  # type: ignore[arg-type]
    snapshot=lambda s: _codec.decode(_codec.encode(s)),
    decide=_scheduler_decide,
    # caches and counters of the cycle machinery, rebuilt from the facts: not part of the state's meaning
    skip=frozenset({"capacity", "capacity_epoch", "pending_log", "node_by_id", "nid"}),
)

QUOTA = CoreSpec[quota.QuotaState](
    name="quota",
    initial=lambda: quota.QuotaState(half_life_s=600.0),
    evolve=quota.evolve,  # type: ignore[arg-type]
    snapshot=lambda s: quota_service.snapshot_codec().decode(quota_service.snapshot_codec().encode(s)),
    decide=quota.decide,
    skip=frozenset({"at"}),
)


@st.composite
def fleet_logs(draw: st.DrawFn, links: bool = False) -> tuple[list[Event], float]:
    """A log as the fleet writes it: FLEET, QUOTA and JOBS events in the order they happened, with the
    scheduler's decisions made on what had been folded so far (as the live service decides). With
    `links`, NIC faults (FAULTS) and perf verdicts (JOBS) too (the scheduler's link health, the gateway's
    timeline)."""
    nodes = [
        a_node(f"n{i}", gpus=draw(st.sampled_from([2, 4, 8])), model=draw(st.sampled_from(["H100", "A100"])))
        for i in range(draw(st.integers(1, 4)))
    ]
    log: list[Event] = []
    state = SchedulerState(retention_s=500.0)

    def happen(*events: Event) -> None:
        for e in events:
            log.append(e)
            evolve(state, e)

    happen(*nodes)
    now, submitted = 10.0, 0
    # A seeded walk rather than a drawn list: long logs with many decisions, still reproducible.
    rng = random.Random(draw(st.integers(0, 2**32)))
    kinds = ["submit"] * 6 + ["cycle"] * 5 + ["quota", "pool", "complete", "complete", "cancel"]
    kinds += ["isolate", "restore", "bad_gpu", "good_gpu", "share", "leave", "join"]
    if links:
        kinds += ["nic_fault", "slow", "recovered"]  # link health (scheduler/core/links.py)
    actions: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(10, 120))):
        kind = rng.choice(kinds)
        if kind == "submit":
            actions.append((kind, rng.choice(TEAMS), rng.choice([1, 2, 4]), rng.random() < 0.3))
        elif kind == "share":  # part of a GPU per replica: fractions of two modes, MIG instances
            actions.append((kind, rng.choice(TEAMS), rng.randrange(len(SHARES)), rng.choice([1, 3])))
        elif kind == "quota":
            actions.append((kind, rng.choice(TEAMS), rng.randint(0, 8)))
        elif kind == "pool":
            actions.append((kind, rng.choice(["h100", "ampere"])))
        elif kind in ("bad_gpu", "good_gpu", "nic_fault", "slow", "recovered"):
            actions.append((kind, rng.randint(0, 3), rng.randint(0, 7)))
        else:
            actions.append((kind, rng.randint(0, 30)))
    names = [n.node for n in nodes]
    joined = len(names)
    for action in [*actions, ("cycle",)]:
        now += 60.0
        kind = action[0]
        if kind == "submit":
            _, team, gpus, high = action
            happen(a_job(f"j{submitted}", team=team, gpus=gpus, at=now, priority="high" if high else "normal"))
            submitted += 1
        elif kind == "share":
            _, team, which, replicas = action
            happen(a_job(f"j{submitted}", team=team, gpus=1, replicas=replicas, at=now, share=SHARES[which]))
            submitted += 1
        elif kind == "cycle":
            happen(*(e for e, _ in _scheduler_decide(state, now)))
        elif kind == "quota":
            happen(a_quota(action[1], action[2], pool="h100" if action[2] % 2 else "default"))
        elif kind == "pool":
            happen(PoolDefined(pool=action[1], at=now, gpu_model="h100" if action[1] == "h100" else "A100"))
        elif kind in ("complete", "cancel") and submitted:
            job = f"j{action[1] % submitted}"
            happen(done(job, at=now) if kind == "complete" else JobCancelled(job_id=job, at=now))
        elif kind == "leave" and len(names) > 1:  # lost, then forgotten (autoscaled away)
            node = names.pop(action[1] % len(names))
            happen(NodeLost(cluster="c1", node=node, at=now, last_seen_at=now - 30.0, reason="silent"))
            happen(NodeForgotten(cluster="c1", node=node, at=now + 30.0, reason="scaled down"))
        elif kind == "join":  # a new node (it may take a forgotten node's id in the scheduler)
            happen(a_node(f"n{joined}", gpus=(2, 4, 8)[action[1] % 3], at=now))
            names.append(f"n{joined}")
            joined += 1
        elif kind in ("isolate", "restore"):
            node = names[action[1] % len(names)]
            cls: Any = NodeIsolated if kind == "isolate" else NodeRestored
            happen(cls(cluster="c1", node=node, at=now, reason="test"))
        elif kind in ("bad_gpu", "good_gpu"):
            node = names[action[1] % len(names)]
            cls = GpuIsolated if kind == "bad_gpu" else GpuRestored
            happen(cls(cluster="c1", node=node, gpu_index=action[2], at=now, reason="test"))
        elif kind == "nic_fault":
            node = names[action[1] % len(names)]
            happen(
                GpuFaultDetected(
                    fault_id=f"{node}/nic{action[2]}/{now}",
                    cluster="c1",
                    node=node,
                    kind=FaultKind.NIC_ERRORS,
                    severity=Severity.WARNING,
                    observed_at=now,
                    gpu_index=action[2],
                )
            )
        elif kind == "slow":
            node, episode = names[action[1] % len(names)], action[2]
            culprit = CulpritKind.NIC if episode % 2 else CulpritKind.FABRIC
            happen(
                JobSlowdownDetected(
                    job_id="other",
                    episode=episode,
                    at=now,
                    since=now,
                    culprit=culprit,
                    score=0.7,
                    confidence=0.9,
                    cluster="c1",
                    node=node,
                    nic="mlx5_0/1",
                    leaf="leaf-0",
                )
            )
        elif kind == "recovered":
            happen(JobSlowdownCleared(job_id="other", episode=action[2], at=now, since=now, reason="recovered"))
    return log, now


BILLING = CoreSpec[billing.BillingState](
    name="billing",
    initial=lambda: billing.BillingState(period_s=300.0, settle_s=0.0),
    evolve=billing.evolve,  # type: ignore[arg-type]
    snapshot=lambda s: billing_service.snapshot_codec().decode(billing_service.snapshot_codec().encode(s)),
    decide=billing.decide,
)

GATEWAY = CoreSpec[gateway.GatewayState](
    name="gateway",
    initial=gateway.GatewayState,
    evolve=gateway.evolve,  # type: ignore[arg-type]
    snapshot=lambda s: (codec := gateway_service.snapshot_codec(gateway.GatewayState())).decode(codec.encode(s)),
)

CORES = [SCHEDULER, QUOTA, BILLING, GATEWAY]
DECIDERS = [core for core in CORES if core.decide is not None]
EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@EXAMPLES
@given(fleet_logs(links=True), st.integers(0, 2**32))
def test_random_interleavings_of_the_input_streams_fold_to_one_state(
    core: CoreSpec[Any], log: tuple[list[Event], float], seed: int
) -> None:
    interleavings_fold_to_one_state(core, log[0], seed)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@EXAMPLES
@given(fleet_logs(), st.integers(0, 200))
def test_snapshot_restore_continue_equals_folding_from_the_start(
    core: CoreSpec[Any], log: tuple[list[Event], float], cut: int
) -> None:
    snapshot_restore_continue(core, log[0], cut)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_logs(links=True))
def test_folding_and_deciding_leave_no_reference_cycles(core: CoreSpec[Any], log: tuple[list[Event], float]) -> None:
    no_reference_cycles(core, log[0], log[1])


@pytest.mark.parametrize("core", DECIDERS, ids=lambda c: c.name)
@EXAMPLES
@given(fleet_logs())
def test_decide_does_not_change_the_state(core: CoreSpec[Any], log: tuple[list[Event], float]) -> None:
    decide_only_reads(core, log[0], log[1] + 30.0)


@pytest.mark.parametrize("core", DECIDERS, ids=lambda c: c.name)
@EXAMPLES
@given(fleet_logs())
def test_a_restart_in_the_middle_of_a_cycle_decides_nothing_twice(
    core: CoreSpec[Any], log: tuple[list[Event], float]
) -> None:
    restart_mid_cycle(core, log[0], log[1] + 30.0)


@EXAMPLES
@given(fleet_logs(links=True), st.integers(0, 2**32), st.integers(0, 200))
def test_the_scheduler_folds_link_health_to_one_state_in_any_interleaving_and_across_a_snapshot(
    log: tuple[list[Event], float], seed: int, cut: int
) -> None:
    interleavings_fold_to_one_state(SCHEDULER, log[0], seed)
    snapshot_restore_continue(SCHEDULER, log[0], cut)
    restart_mid_cycle(SCHEDULER, log[0], log[1] + 30.0)


def _scheduler_commands() -> tuple[Any, ...]:
    import argparse

    from tests.integration.test_scheduler_service import ARGS

    return scheduler_service.Scheduler(argparse.Namespace(nats="", **ARGS[scheduler_service])).commands()


# (core, its manifest's commands, requests): every read and change a person can send, against any log
COMMAND_CASES = [
    (
        QUOTA,
        lambda: quota_service.COMMANDS,
        [
            ("set", {"team": "vision", "gpus": 3, "budget": 100.0, "expected_seq": 2}),
            ("patch", {"team": "nlp", "weight": 2.0, "critical": True, "expected_seq": 0}),
            ("pool_set", {"name": "h100x", "gpu_model": "H100"}),
            ("list", {}),
        ],
    ),
    (
        BILLING,
        lambda: billing_service.COMMANDS,
        [("price", {"gpu_model": "H100", "price_per_gpu_hour": 2.5}), ("reclaimed", {"month": "2026-11"})],
    ),
    (
        SCHEDULER,
        _scheduler_commands,
        [
            ("submit", {"team": "vision", "gpus": 2, "priority": "critical", "allow_wait": True}),
            ("submit", {"team": "nlp", "gpus": 1, "request_id": "r1"}),
            ("cancel", {"job": "j0", "expected_seq": 1}),
            ("queue", {"all": True}),
            ("explain", {"job": "j1"}),
            ("resume", {"job": "j0", "by": "alice"}),
        ],
    ),
]


@pytest.mark.parametrize("case", COMMAND_CASES, ids=lambda c: c[0].name)
@EXAMPLES
@given(fleet_logs())
def test_commands_only_read_the_state(case: Any, log: tuple[list[Event], float]) -> None:
    """A command's `validate` and `answer` are pure: whatever they say (the events to append, a refusal,
    "ask the log"), the state is as they found it; it changes only when the events come back."""
    from events.names import InvalidName, decode_request
    from services.runtime.commands import CommandRefused, FromLog

    core, commands, requests = case
    by_verb = {c.verb: c for c in commands()}
    state = fold(core, log[0])
    before = canon(state, core.skip)
    for verb, payload in requests:
        command = by_verb[verb]
        request = decode_request(payload, command.request)
        with contextlib.suppress(CommandRefused, InvalidName, FromLog):
            if command.answer is not None:
                command.answer(state, request, log[1] + 1.0)
            else:
                command.validate(state, request, log[1] + 1.0)
        assert canon(state, core.skip) == before, verb
