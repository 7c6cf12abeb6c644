"""Command requests (`chamber.cmd.<service>.<verb>` over NATS request/reply), typed once.

The command handlers decode with these types, the gateway checks HTTP bodies with them before it
forwards (so a bad body is a 422 naming the field), and /openapi.json and asyncapi.json publish their
JSON Schemas. The limits come from events/names.py, the same as the events they become, so a request
these types accept is never refused by a consumer afterwards. Unknown fields are refused: a typo such
as `borrow` for `borrow_limit` must not silently reset a limit.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from events.idle import IdleModeName, Minutes, Percent
from events.jobs import CpuMilli, HostMemoryMib, MemoryMib, PriorityClass, ShareMilliAsked, ShareMode
from events.names import (
    TEAM_MAX,
    GpuCount,
    GpusPerReplica,
    Label,
    Model,
    Name,
    Replicas,
    Seconds,
    SecondsOrZero,
    Text,
    normalize_team,
)
from events.quota import BudgetAction

DEFAULT_POOL = "default"
# Accepted before normalisation (`Vision ` is the team `vision`); `normalize_team` applies the rule.
TeamInput = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=TEAM_MAX + 8,
        description="team name; trimmed and lower-cased, then it must be lower-case letters, digits and '-'",
    ),
]
# A per-entity change's optimistic check: the entity's sequence as the requester read it (the `seq` of
# the answer to its last change). Omitted: the latest the service has folded. Either way, if the
# entity changed since, the change is refused and says so: read it again and retry.
ExpectedSeq = Annotated[
    int,
    msgspec.Meta(ge=0, description="the entity's sequence as you read it (`seq` of a change's answer); "
                 "refused if it changed since"),
]  # fmt: skip


class SubmitJob(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.scheduler.submit`. `gpus` is per replica; `gpus_per_replica` is an alias."""

    team: TeamInput
    gpus: GpusPerReplica | None = None
    gpus_per_replica: GpusPerReplica | None = None
    replicas: Replicas = 1
    priority: PriorityClass = PriorityClass.NORMAL
    name: Label = ""
    id: Name | None = None
    pool: Name | None = None
    cluster: Name | None = None
    gpu_model: Model | None = None
    preemptible: bool = True
    checkpoint_interval_s: Seconds | None = None
    expected_duration_s: Seconds | None = None
    sim_duration_s: SecondsOrZero | None = None
    topology_key: Name | None = None
    # Part of one GPU per replica instead of whole GPUs: a fraction (`gpu_milli` of 1000, optionally
    # `gpu_memory_mib` of its memory, shared by `share_mode`), or one MIG instance (`mig_profile`)
    gpu_milli: ShareMilliAsked | None = None
    gpu_memory_mib: MemoryMib | None = None
    share_mode: ShareMode | None = None
    mig_profile: Name | None = None
    # Each replica's need of its node's CPUs (milli-CPUs) and host memory (MiB); None: not asked
    cpu_milli: CpuMilli | None = None
    memory_mib: HostMemoryMib | None = None
    # The client's id for this request: a retry with the same one (after a timeout, a 503) is
    # applied once and answers with the same job. Without `id`, the job id is derived from it.
    request_id: Name | None = None
    # keep a job that cannot run on the fleet as installed (its model absent, larger than the fleet or
    # than its team may hold) waiting, instead of refusing it
    allow_wait: bool = False

    def __post_init__(self) -> None:
        self.team = normalize_team(self.team)


class CancelJob(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.scheduler.cancel`. `job_id` is an alias of `job`."""

    job: Name | None = None
    job_id: Name | None = None
    by: Text = ""
    reason: Text = ""
    expected_seq: ExpectedSeq | None = None


class ListQueue(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.scheduler.queue`: the waiting jobs (and, with `all`, the finished ones), a page at a time."""

    all: bool = False
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None


class ExplainJob(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.scheduler.explain`."""

    job: Name


class NoArguments(msgspec.Struct, forbid_unknown_fields=True):
    """A command that takes nothing (`chamber.cmd.perf.status`, `chamber.cmd.perf.fabric`)."""


class JobOnly(msgspec.Struct, forbid_unknown_fields=True):
    """`chamber.cmd.perf.explain` and `chamber.cmd.perf.ranks`: one job."""

    job: Name


class SetTeamQuota(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.quota.set`: replaces the team's quota in the pool (fields left out take their
    defaults: no borrow or lend limit, weight 1; `quota.patch` changes only what it names). `gpus` is
    the guarantee; `guaranteed_gpus` an alias."""

    team: TeamInput
    gpus: GpuCount | None = None
    guaranteed_gpus: GpuCount | None = None
    pool: Name = DEFAULT_POOL
    borrow_limit: GpuCount | None = None
    lend_limit: GpuCount | None = None
    # idle guaranteed GPUs other teams' non-preemptible work may use, returned by draining (None: half of what it lends)
    np_lend_limit: GpuCount | None = None
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 1.0
    critical: bool = False  # may the team run critical work in this pool
    budget: Annotated[float, msgspec.Meta(ge=0, le=1e15)] | None = None  # spending limit per period
    currency: Annotated[str, msgspec.Meta(min_length=1, max_length=8)] = "USD"
    period: Annotated[str, msgspec.Meta(min_length=1, max_length=16)] = "month"
    on_budget: BudgetAction = BudgetAction.NOTIFY  # what the scheduler does once the budget is exceeded
    expected_seq: ExpectedSeq | None = None

    def __post_init__(self) -> None:
        self.team = normalize_team(self.team)


Weight = Annotated[float, msgspec.Meta(gt=0, le=1000)]
Budget = Annotated[float, msgspec.Meta(ge=0, le=1e15)]


class PatchTeamQuota(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.quota.patch`: changes only the fields given; the others keep their current values
    (a team without a quota in the pool needs `gpus`). `null` clears a limit (no borrow or lend limit;
    `np_lend_limit` back to half of what the team lends). The budget is the team's, in every pool."""

    team: TeamInput
    pool: Name = DEFAULT_POOL
    gpus: GpuCount | msgspec.UnsetType = msgspec.UNSET
    borrow_limit: GpuCount | msgspec.UnsetType | None = msgspec.UNSET
    lend_limit: GpuCount | msgspec.UnsetType | None = msgspec.UNSET
    np_lend_limit: GpuCount | msgspec.UnsetType | None = msgspec.UNSET
    weight: Weight | msgspec.UnsetType = msgspec.UNSET
    critical: bool | msgspec.UnsetType = msgspec.UNSET
    budget: Budget | msgspec.UnsetType = msgspec.UNSET
    currency: Annotated[str, msgspec.Meta(min_length=1, max_length=8)] | msgspec.UnsetType = msgspec.UNSET
    period: Annotated[str, msgspec.Meta(min_length=1, max_length=16)] | msgspec.UnsetType = msgspec.UNSET
    on_budget: BudgetAction | msgspec.UnsetType = msgspec.UNSET
    expected_seq: ExpectedSeq | None = None  # not a setting: `given()` leaves it out

    def __post_init__(self) -> None:
        self.team = normalize_team(self.team)

    def given(self) -> dict[str, object]:
        """The fields the request names (UNSET ones left out)."""
        return {
            f: v for f in self.__struct_fields__ if f != "expected_seq" and (v := getattr(self, f)) is not msgspec.UNSET
        }


class RestoreNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.health.restore` (and `confirm`, `dismiss`): a node, or one GPU of it."""

    node: Name
    cluster: Name = "local"
    gpu: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    by: Text = "operator"
    expected_seq: ExpectedSeq | None = None


class SetIdlePolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.perf.idle_policy`: a team's idle-reclaim policy, replaced whole (fields left out
    take their defaults, docs/idle-reclaim.md)."""

    team: TeamInput
    mode: IdleModeName = IdleModeName.OFF
    sm_below_pct: Percent = 5.0
    memory_tolerance_mib: Annotated[float, msgspec.Meta(ge=0)] = 64.0
    idle_minutes: Annotated[float, msgspec.Meta(gt=0, le=7 * 24 * 60)] = 30.0
    grace_minutes: Minutes = 15.0
    by: Text = "operator"

    def __post_init__(self) -> None:
        self.team = normalize_team(self.team)


class ResumeJob(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.scheduler.resume`: queue again a job suspended as idle."""

    job: Name
    by: Text = ""
    expected_seq: ExpectedSeq | None = None


class AbandonMigChange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.scheduler.mig_abandon`: give up the MIG change planned for a node that did not apply
    (the MIG manager failed): its GPUs keep the layout last applied and Chamber lifts its cordon."""

    node: Name
    cluster: Name = "local"
    by: Text = "operator"
    reason: Text = ""


class ForgetNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`chamber.cmd.discovery.forget`: forget a lost node that left the fleet for good (NodeForgotten)."""

    node: Name
    cluster: Name = "local"
    by: Text = "operator"
    reason: Text = ""
    expected_seq: ExpectedSeq | None = None


# service -> verb -> request type, for the API documents and the gateway's checks.
REQUESTS: dict[str, dict[str, type[msgspec.Struct]]] = {
    "scheduler": {
        "submit": SubmitJob,
        "cancel": CancelJob,
        "queue": ListQueue,
        "explain": ExplainJob,
        "resume": ResumeJob,
        "mig_abandon": AbandonMigChange,
    },
    "quota": {"set": SetTeamQuota, "patch": PatchTeamQuota},
    "discovery": {"forget": ForgetNode},
    "health": {"restore": RestoreNode, "confirm": RestoreNode, "dismiss": RestoreNode},
    "perf": {
        "status": NoArguments,
        "fabric": NoArguments,
        "explain": JobOnly,
        "ranks": JobOnly,
        "idle_policy": SetIdlePolicy,
        "idle": NoArguments,
    },
}
