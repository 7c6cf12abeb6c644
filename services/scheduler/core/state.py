"""The scheduler's state, folded from JOBS, FLEET and QUOTA events by `evolve(state, event)`.

`evolve` mutates the state in place (a fleet of 10,000 nodes is not copied per event) and never
raises on a valid event: an event about an unknown job or node is ignored. The state keeps derived
indexes up to date (free-GPU buckets, usage per team, the ordered queue) so a cycle never scans
the whole fleet or history.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from events import (
    BudgetExceeded,
    BudgetSet,
    Event,
    FairShareUpdated,
    GpuIsolated,
    GpuRestored,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSuspended,
    NodeDiscovered,
    NodeForgotten,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeStatus,
    NodeUpdated,
    Placement,
    PoolDefined,
    PoolRemoved,
    TeamQuotaSet,
)
from events.fabric import JobSlowdownCleared, JobSlowdownDetected
from events.faults import GpuFaultDetected
from events.fleet import IsolationDismissed, IsolationHeld, MigChangeAbandoned, MigLayoutApplied, MigLayoutPlanned
from events.idle import JobIdleDetected, JobResumeRequested
from events.jobs import GpuShare
from events.telemetry import GpuInfo
from services.pools import DEFAULT_POOL, PoolDef, Quota, job_pool, node_pool
from services.scheduler.core.budget import BudgetRule, demoted, fold_budget_exceeded, fold_budget_set
from services.scheduler.core.capacity import Capacity
from services.scheduler.core.idle import IdleReclaim, fold_idle_detected, fold_resume_requested
from services.scheduler.core.links import LinkHealth, fold_cleared, fold_fault, fold_kind, fold_slowdown
from services.scheduler.core.mig_live import (
    MigState,
    fold_abandoned,
    fold_applied,
    fold_planned,
    managed,
    mig_held,
    reconfiguring,
)
from services.scheduler.core.shares import SharedGpu, equivalents, holding, mode_of, plus, room
from services.scheduler.core.sortedlist import SortedList
from services.scheduler.core.victim_costs import CostColumns

DEFAULT_TOPOLOGY_KEY = "rack"
KUBERNETES_KEEP_S = 6 * 3600.0  # a finished Kubernetes workload's job stays known this long at least
PENDING_LOG_KEPT = 100_000  # queue entries kept for incremental cycles; then a trim (and one full cycle)


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


QUEUED = (JobState.PENDING, JobState.SUSPENDED)
FINISHED = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class Job:
    id: str
    spec: JobSpec
    submitted_at: float
    pool: str
    state: JobState = JobState.PENDING
    placements: list[Placement] = field(default_factory=list)
    running_since: float | None = None  # last scheduled/resumed
    queued_since: float = 0.0  # when it last joined the queue (submitted, suspended, requeued): its age
    started_at: float | None = None  # the executor's JobStarted
    finished_at: float | None = None
    borrowed_gpus: float = 0
    generation: int = 0  # placement changes folded so far: makes decision ids unique and stable
    ran_before: bool = False  # then admission is a resume
    reason: str = ""  # why it is where it is (last decision or event)
    preempted_by: str | None = None
    preempt_reason: str | None = None
    preemptions: int = 0
    # What its quota counts, kept as a field (read on every hot path): spec.total_gpus, or for a job that
    # shares GPUs its GPU-equivalents (shares.equivalents: a float)
    gpus: float = 0
    note: str = ""  # a standing remark for `chamber explain` (e.g. demoted by its team's budget)
    # The pool came with a decision (JobScheduled/JobResumed) while it held GPUs. Otherwise it is
    # derived from the current rules and re-derived when they change, so it does not depend on
    # whether QUOTA or JOBS was folded first.
    pool_fixed: bool = False

    def __post_init__(self) -> None:
        self.gpus = self.spec.total_gpus if self.spec.share is None else equivalents(self.spec)


def estimate_s(job: Job) -> float | None:
    """The runtime estimate used for backfill: the user's estimate, else the simulated duration."""
    return job.spec.expected_duration_s or job.spec.sim_duration_s


EndEntry = tuple[float, float, str]  # (estimated end: running since + estimate, GPUs, job id)


def _end_entry(job: Job) -> EndEntry | None:
    est = estimate_s(job)
    if est is None or job.running_since is None:
        return None
    return (job.running_since + est, job.gpus, job.id)


@dataclass
class Node:
    nid: int
    cluster: str
    name: str
    gpus: dict[int, str]  # index -> model
    labels: dict[str, str]
    status: NodeStatus = NodeStatus.HEALTHY
    isolated: bool = False
    lost: bool = False
    bad_gpus: set[int] = field(default_factory=set)
    owners: dict[int, str] = field(default_factory=dict)  # gpu index -> job id holding it
    # Why the node / a GPU went out of service, and the faults behind it: a requeued job says so.
    out_reason: str = ""
    out_faults: tuple[str, ...] = ()
    gpu_out: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # Isolations health's budget held back (GPU index, None: the whole node) -> reason: the fault would
    # have isolated it, so new work stays off it; work already there runs on until an operator decides.
    held: dict[int | None, str] = field(default_factory=dict)
    shared: dict[int, SharedGpu] = field(default_factory=dict)  # gpu index -> the jobs sharing it (shares.py)
    gpu_memory: dict[int, int] = field(default_factory=dict)  # gpu index -> its memory in MiB, where known
    mig: dict[int, MigState] = field(default_factory=dict)  # gpu index -> its managed MIG layout (mig_live.py)
    gpu_uuids: dict[int, str] = field(default_factory=dict)  # gpu index -> its UUID (pods are told theirs)
    cpu_milli: int | None = None  # the host's CPU and memory work may use (None: unknown, no limit)
    memory_mib: int | None = None
    _model: str = ""
    _model_of: object = None

    @property
    def in_service(self) -> bool:
        return not self.isolated and not self.lost and self.status == NodeStatus.HEALTHY

    def offers(self, gpu: int) -> bool:
        """Whether the GPU may be given to new work: healthy, and no isolation of it or its node held."""
        return gpu not in self.bad_gpus and gpu not in self.held and None not in self.held

    @property
    def model(self) -> str:
        """The node's GPU model (the most common one, should a node mix models)."""
        if self._model_of is not self.gpus:
            models = sorted(self.gpus.values())
            self._model = max(models, key=models.count) if models else ""
            self._model_of = self.gpus
        return self._model


QueueKey = tuple[int, float, float, str]  # priority rank, -fair share, submit time, job id
# What decides a waiting job's answer when it does not fit (same shape, same answer in a cycle):
# pool, team, priority rank, GPU model, cluster, GPUs per replica, replicas, preemptible
Shape = tuple[str, str, int, str | None, str | None, int, int, bool, GpuShare | None, int | None, int | None]
QueueEntry = tuple[QueueKey, int, float]  # a queued job's key, its shape's number, when it joined the queue


def shape_of(job: Job) -> Shape:
    spec = job.spec
    return (
        job.pool,
        spec.team,
        spec.priority.rank,
        spec.gpu_model,
        spec.cluster,
        spec.gpus_per_replica,
        spec.replicas,
        spec.preemptible,
        spec.share,
        spec.cpu_milli,  # a job asking less of a node's CPU or memory may fit where one asking more did not
        spec.memory_mib,
    )


class Derived:
    """Indexes derived from the state's facts for the cycle's hot paths, kept by the fold once a
    cycle first asks for them (`derived(state)`). Never saved: it pickles empty, so a snapshot holds
    facts only and a loaded state builds these again on first use."""

    def __init__(self) -> None:
        # (pool, team, priority rank) -> running preemptible jobs: the preemption search's groups
        self.victims: dict[tuple[str, str, int], dict[str, Job]] | None = None
        # the same groups by node, (cluster, node) -> GPUs their placements list there and the jobs
        # placed there (built and kept with `victims`): a search for room on one node reads only the
        # nodes its eligible groups could empty enough (preemption.py)
        self.node_gpus: dict[tuple[str, str, int], dict[tuple[str, str], int]] = {}
        self.node_jobs: dict[tuple[str, str, int], dict[tuple[str, str], dict[str, Job]]] = {}
        # running preemptible job -> (node id, GPUs listed) per placement, kept once a search first
        # reads the job (`nids_of`): a search walks thousands of victims' placements
        self.nids: dict[str, tuple[tuple[int, int], ...]] = {}
        # The groups by node again, as columns by node id: GPUs listed there, and placements there.
        # A search for room on one node adds up a few columns (preemption.py) instead of reading every
        # node's entry. A group with work on a node not discovered then is not kept so (`partial`).
        self.nodes: dict[tuple[str, str], Node] | None = None  # the state's nodes (`derived` sets them)
        self.on_nodes: dict[tuple[str, str, int], tuple[array[int], array[int]]] = {}
        self.partial: set[tuple[str, str, int]] = set()
        # what each group's victim costs are computed from, as columns (victim_costs.py)
        self.costs: dict[tuple[str, str, int], CostColumns] = {}
        # job id -> (queue key, shape number, queued since) of every queued job, in no order: what a
        # full cycle sorts (O(1) to keep as jobs join and leave the queue, where a sorted list moves
        # half of itself each time), and what it reads per job without touching the job
        self.queued: dict[str, QueueEntry] | None = None
        self.table: Any = None  # the same entries as numpy columns (queue_table.py), once a full cycle asks
        self.shapes: dict[Shape, int] = {}  # each shape seen, numbered (a cycle keys its answers by number)

    def shape_id(self, job: Job) -> int:
        shape = shape_of(job)
        found = self.shapes.get(shape)
        if found is None:
            found = self.shapes[shape] = len(self.shapes)
        return found

    def __reduce__(self) -> tuple[type[Derived], tuple[()]]:
        return (Derived, ())

    def victim_groups(self, jobs: dict[str, Job]) -> dict[tuple[str, str, int], dict[str, Job]]:
        if self.victims is None:
            self.victims = {}
            for job in jobs.values():
                if job.state == JobState.RUNNING:
                    self.add_running(job)
        return self.victims

    def add_running(self, job: Job) -> None:
        if self.victims is not None and job.spec.preemptible:
            group = (job.pool, job.spec.team, job.spec.priority.rank)
            if group not in self.victims:  # (no `setdefault`: it would build the empty tables every time)
                self.victims[group], self.costs[group] = {}, CostColumns()
                self.node_gpus.setdefault(group, {})
                self.node_jobs.setdefault(group, {})
            self.victims[group][job.id] = job
            self.costs[group].add(job)
            gpus, jobs = self.node_gpus[group], self.node_jobs[group]
            for p in job.placements:
                key = (p.cluster, p.node)
                gpus[key] = gpus.get(key, 0) + len(p.gpu_indices)
                on = jobs.get(key)
                if on is None:
                    on = jobs[key] = {}
                on[job.id] = job
            self._columns_add(group, job)

    def _columns_add(self, group: tuple[str, str, int], job: Job, sign: int = 1) -> None:
        """Add (+1) or take away (-1) a job's placements in the group's columns by node id (`array`s:
        cheap to change one row of, read column-wise as numpy without a copy). A group with work on a
        node not discovered then is marked `partial` (its columns are not read again); nodes are never
        forgotten and keep their ids, so what is taken away is what was added."""
        nodes = self.nodes
        cols = self.on_nodes.get(group)
        if cols is None:
            cols = self.on_nodes[group] = (array("q"), array("q"))
        gpus, placed = cols
        for p in job.placements:
            node = None if nodes is None else nodes.get((p.cluster, p.node))
            if node is None:
                self.partial.add(group)
                return
            nid = node.nid
            if nid >= len(gpus):
                more = max(nid + 1, len(nodes or ())) - len(gpus)
                gpus.frombytes(bytes(8 * more))
                placed.frombytes(bytes(8 * more))
            gpus[nid] += sign * len(p.gpu_indices)
            placed[nid] += sign

    def nids_of(self, job: Job, nodes: dict[tuple[str, str], Node]) -> tuple[tuple[int, int], ...]:
        """(node id, GPUs listed there) per placement of a running job (nodes keep their ids)."""
        found = self.nids.get(job.id)
        if found is None:
            found = self.nids[job.id] = tuple(
                (nodes[(p.cluster, p.node)].nid, len(p.gpu_indices)) for p in job.placements
            )
        return found

    def drop_running(self, job: Job) -> None:
        self.nids.pop(job.id, None)
        if self.victims is not None and job.spec.preemptible:
            group = (job.pool, job.spec.team, job.spec.priority.rank)
            if group not in self.partial and job.id in self.victims.get(group, ()):
                self._columns_add(group, job, -1)
            self.victims.get(group, {}).pop(job.id, None)
            if (costs := self.costs.get(group)) is not None:
                costs.drop(job.id)
            gpus, jobs = self.node_gpus.get(group, {}), self.node_jobs.get(group, {})
            for key, n in _per_node(job).items():
                if job.id in jobs.get(key, ()):
                    gpus[key] -= n
                    del jobs[key][job.id]
                    if not jobs[key]:
                        del gpus[key], jobs[key]


def _per_node(job: Job) -> dict[tuple[str, str], int]:
    """(cluster, node) -> the GPUs the job's placements list there."""
    out: dict[tuple[str, str], int] = {}
    for p in job.placements:
        out[(p.cluster, p.node)] = out.get((p.cluster, p.node), 0) + len(p.gpu_indices)
    return out


def derived(state: SchedulerState) -> Derived:
    """The state's derived indexes (an attribute outside the dataclass's fields: the snapshot's
    format, which names the fields, stays the same)."""
    found = state.__dict__.get("_derived")
    if found is None:
        found = state.__dict__["_derived"] = Derived()
        found.nodes = state.nodes
    return found


def _derived_if_built(state: SchedulerState) -> Derived | None:
    found: Derived | None = state.__dict__.get("_derived")
    return found


class PendingLog:
    """Job ids in the order they (re)entered the queue, indexed from the start of history (a cycle
    mark keeps an index into it). `trim` drops what is held; the caller bumps the capacity epoch
    with it, so no incremental cycle reads from before the trim (the next one is full)."""

    def __init__(self) -> None:
        self.base = 0
        self.items: list[str] = []

    def append(self, job_id: str) -> None:
        self.items.append(job_id)

    def __len__(self) -> int:
        return self.base + len(self.items)

    def __getitem__(self, index: slice) -> list[str]:
        if not isinstance(index, slice) or index.step is not None or index.stop is not None:
            raise TypeError("PendingLog supports [start:] only")
        return self.items[max(0, (index.start or 0) - self.base) :]

    def trim(self) -> None:
        self.base += len(self.items)
        self.items = []


@dataclass
class SchedulerState:
    topology_key: str = DEFAULT_TOPOLOGY_KEY
    jobs: dict[str, Job] = field(default_factory=dict)
    nodes: dict[tuple[str, str], Node] = field(default_factory=dict)
    node_by_id: list[Node] = field(default_factory=list)
    capacity: Capacity = field(default_factory=Capacity)
    pools: dict[str, PoolDef] = field(default_factory=dict)
    quotas: dict[tuple[str, str], Quota] = field(default_factory=dict)  # (pool, team)
    team_pools: dict[str, list[str]] = field(default_factory=dict)
    fair_share: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, team) -> (0, 1]
    usage: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, team) -> GPUs(-equivalents) held
    preemptible: dict[tuple[str, str, int], float] = field(default_factory=dict)  # (pool, team, rank) -> GPUs
    running: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (pool, team) -> job ids
    displaced: set[str] = field(default_factory=set)  # running on a GPU or node out of service
    # node ids with GPUs that hold shares (Node.shared), so placing a share reads those nodes, not the fleet
    shared_nodes: dict[int, None] = field(default_factory=dict)
    # node ids of MIG-managed nodes (the GPU Operator's mig.config label, or a layout folded): the planner's
    mig_nodes: dict[int, None] = field(default_factory=dict)
    # node ids of forgotten nodes (NodeForgotten), given to the next nodes discovered: `node_by_id` keeps
    # a bare lost node at each (a slot that offers nothing) until then, so ids never move and the
    # lists indexed by them stay as long as the largest fleet, however many nodes come and go
    free_nids: list[int] = field(default_factory=list)
    # GPUs claimed by jobs on nodes not (yet) discovered: replaying JOBS may run ahead of FLEET
    claims: dict[tuple[str, str], dict[int, str]] = field(default_factory=dict)
    # jobs holding shares on nodes not (yet) discovered, in the order they were placed (folded on discovery)
    share_claims: dict[tuple[str, str], dict[str, None]] = field(default_factory=dict)
    capacity_epoch: int = 0  # bumped when capacity frees or the rules change: the next cycle is full
    pending_log: PendingLog = field(default_factory=PendingLog)  # job ids as they (re)entered the queue
    budgets: dict[str, BudgetRule] = field(default_factory=dict)  # team -> budget and its action (budget.py)
    idle_reclaim: dict[str, IdleReclaim] = field(default_factory=dict)  # job -> idle verdict to act on (idle.py)
    # Bounded memory: a finished job leaves the state `retention_s` (event time, the JOBS stream's
    # `at`) after it finished; 0: as soon as it finishes (nothing in a cycle needs it: fair share is
    # the quota service's aggregate), except a Kubernetes workload's, kept `KUBERNETES_KEEP_S` so the
    # reconcile tells a cancelled workload from a new one; None keeps every job. The log and the
    # warehouse keep the history (`chamber explain` of a forgotten job reads the log).
    retention_s: float | None = None
    jobs_clock: float = 0.0  # the latest `at` folded from JOBS: the clock retention runs on
    finished_heap: list[tuple[float, str]] = field(default_factory=list)  # (leaves memory at, job id)
    forgotten: int = 0  # finished jobs dropped so far
    forgotten_until: float = 0.0  # the JOBS time expired jobs were last dropped at (in steps: `_age`)
    _queue: list[QueueKey] | None = None  # the queue by `queue_key`, sorted when asked for (None: not yet)
    # Queued jobs per team in submit order, (submit time, id): first-come-first-served lines for
    # the head-of-line baselines (fifo, static-quota), so a cycle reads heads, not the whole queue.
    fifo_lines: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    # Degraded NICs and congested leaves (perf verdicts, NIC faults): gangs are placed away from them
    links: LinkHealth = field(default_factory=LinkHealth)
    # Derived, built on first use (None: not built): pool -> the running jobs with a runtime
    # estimate, sorted by estimated end. EASY backfill and the preemption-worth check read the ends
    # up to a horizon from it instead of walking every running job each time.
    _ends: dict[str, SortedList[EndEntry]] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._ends is not None:  # snapshots from before the ends were chunked hold plain sorted lists
            self._ends = {p: e if isinstance(e, SortedList) else SortedList(e) for p, e in self._ends.items()}

    # -- the queue -----------------------------------------------------------------------------
    def queue_key(self, job: Job) -> QueueKey:
        """Queue order: priority class, then fair-share factor (higher first), then submit time,
        then job id (unique tie-breaker). A suspended job keeps its submit time, so its place."""
        factor = self.fair_share.get((job.pool, job.spec.team), 1.0)
        return (job.spec.priority.rank, -factor, job.submitted_at, job.id)

    def queue(self) -> list[QueueKey]:
        """The queued jobs' keys, sorted (a cycle orders `queued_keys` by its policy instead)."""
        if self._queue is None:
            self._queue = sorted(self.queued_keys())
        return self._queue

    def queued_keys(self) -> list[QueueKey]:
        """Every queued job's key, in no particular order."""
        return [entry[0] for entry in self.queued_entries().values()]

    def queued_entries(self) -> dict[str, QueueEntry]:
        """Job id -> (queue key, shape number, queued since) of every queued job (not to be changed)."""
        index = derived(self)
        if index.queued is None:
            index.queued = {j.id: self._entry(index, j) for j in self.jobs.values() if j.state in QUEUED}
        return index.queued

    def _entry(self, index: Derived, job: Job) -> QueueEntry:
        return (self.queue_key(job), index.shape_id(job), job.queued_since)

    def reorder(self) -> None:
        """Queue keys changed under the queued jobs (fair share, priority, pools): computed again."""
        self._queue = None
        if (index := _derived_if_built(self)) is not None:
            index.queued = index.table = None

    def _enqueue(self, job: Job) -> None:
        insort(self.fifo_lines.setdefault(job.spec.team, []), (job.submitted_at, job.id))
        self._queue = None
        if (index := _derived_if_built(self)) is not None and index.queued is not None:
            entry = index.queued[job.id] = self._entry(index, job)
            if index.table is not None:
                index.table.add(job.id, entry)
        if len(self.pending_log.items) >= PENDING_LOG_KEPT:
            # Bounded: no incremental cycle reads from before the trim (the epoch makes the next one full).
            self.pending_log.trim()
            self.capacity_epoch += 1
        self.pending_log.append(job.id)

    def _dequeue(self, job: Job) -> None:
        line = self.fifo_lines.get(job.spec.team, [])
        i = bisect_left(line, (job.submitted_at, job.id))
        if i < len(line) and line[i][1] == job.id:
            del line[i]
        self._queue = None
        if (index := _derived_if_built(self)) is not None and index.queued is not None:
            index.queued.pop(job.id, None)
            if index.table is not None:
                index.table.drop(job.id)

    # -- classes -------------------------------------------------------------------------------
    def node_class(self, node: Node) -> int:
        pool = node_pool(self.pools, node.model, node.labels)
        return self.capacity.class_id((pool, node.cluster, node.model))

    def refresh_node(self, node: Node) -> None:
        # a held isolation takes the GPU (or node) out of the capacity new work is placed on
        healthy = [i for i in node.gpus if node.offers(i)]
        free = [i for i in healthy if i not in node.owners and i not in node.shared]
        if node.mig:  # a managed GPU in MIG mode or being changed is not a whole GPU; a changing node takes nothing
            free = [i for i in free if not mig_held(node, i)]
        domain = node.labels.get(self.topology_key, "")
        offered = node.in_service and None not in node.held and not (node.mig and reconfiguring(node))
        self.capacity.set_slot(node.nid, self.node_class(node), free, len(healthy), offered, domain)

    # -- estimated ends ------------------------------------------------------------------------
    def running_ends(self, pool: str) -> SortedList[EndEntry]:
        """(estimated end, GPUs, job id) of the pool's running jobs with an estimate, by end."""
        if self._ends is None:
            ends: dict[str, list[EndEntry]] = {}
            for (p, _), ids in self.running.items():
                for jid in ids:
                    if (entry := _end_entry(self.jobs[jid])) is not None:
                        ends.setdefault(p, []).append(entry)
            self._ends = {p: SortedList(line) for p, line in ends.items()}
        found = self._ends.get(pool)
        return SortedList() if found is None else found

    def _add_end(self, job: Job) -> None:
        if self._ends is not None and (entry := _end_entry(job)) is not None:
            ends = self._ends.get(job.pool)
            if ends is None:  # (no `setdefault`: it would build an empty list for every job folded)
                ends = self._ends[job.pool] = SortedList()
            ends.add(entry)

    def _drop_end(self, job: Job) -> None:
        if self._ends is not None and (entry := _end_entry(job)) is not None and job.pool in self._ends:
            self._ends[job.pool].discard(entry)

    def pool_of_node(self, node: Node) -> str:
        return self.capacity.class_keys[self.capacity.slots[node.nid].cls][0]


# -- evolve ------------------------------------------------------------------------------------
def evolve(state: SchedulerState, event: Event) -> SchedulerState:
    """Fold one event into the state (in place; returned for convenience)."""
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event)
        if state.retention_s is not None and type(event) in _JOB_EVENTS:
            _age(state, event.at)  # type: ignore[attr-defined]
    return state


def _age(s: SchedulerState, at: float) -> None:
    """Drop finished jobs older than the retention window. Done in steps of a tenth of the window,
    so the cost is paid rarely; each step starts a full cycle (the capacity epoch moves), as the
    queue log that incremental cycles read is trimmed with it."""
    if at <= s.jobs_clock:
        return
    s.jobs_clock = at
    assert s.retention_s is not None
    window = max(s.retention_s, KUBERNETES_KEEP_S) if s.retention_s == 0 else s.retention_s
    if at - s.forgotten_until < window / 10 or not s.finished_heap:
        return
    while s.finished_heap and s.finished_heap[0][0] < at:
        _, job_id = heapq.heappop(s.finished_heap)
        job = s.jobs.get(job_id)
        if job is not None and job.state in FINISHED:
            del s.jobs[job_id]
            s.forgotten += 1
    s.forgotten_until = at
    s.pending_log.trim()
    s.capacity_epoch += 1


def _submitted(s: SchedulerState, e: JobSubmitted) -> None:
    if e.job_id in s.jobs:
        return
    spec, note = demoted(s, e.spec, e.at)
    job = Job(
        id=e.job_id, spec=spec, submitted_at=e.at, pool=job_pool(spec, s.team_pools), queued_since=e.at, note=note
    )
    job.reason = "submitted; waiting for the next scheduling cycle"
    s.jobs[job.id] = job
    s._enqueue(job)


def _hold(
    s: SchedulerState, job: Job, placements: list[Placement], at: float, borrowed: float, reason: str, pool: str
) -> None:
    if job.state not in QUEUED:
        return  # a duplicate or stale decision: the job already runs or has finished
    # The cycle's indexes of running work are built here, once (before this job runs), and kept
    # from then on, so no cycle pays for building them.
    s.running_ends(job.pool)
    derived(s).victim_groups(s.jobs)
    s._dequeue(job)
    job.pool = pool  # the pool the decision was made in, whatever the quota state is at this point of the fold
    job.pool_fixed = True
    job.state = JobState.RUNNING
    # the event's own list (no copy: one object less per placement for the collector to walk, and no
    # one changes a placements list in place: a job's is replaced when it moves, emptied by assignment)
    job.placements = placements if placements.__class__ is list else list(placements)
    job.running_since = at
    job.started_at = None
    job.borrowed_gpus = borrowed
    job.generation += 1
    job.ran_before = True
    job.reason = reason
    conflict = _hold_shares(s, job, placements) if job.spec.share is not None else False
    for p in placements if job.spec.share is None else ():
        node = s.nodes.get((p.cluster, p.node))
        if node is None:
            s.claims.setdefault((p.cluster, p.node), {}).update(dict.fromkeys(p.gpu_indices, job.id))
            continue
        clean = node.in_service
        for i in p.gpu_indices:
            if i in node.owners or i in node.shared:
                conflict, clean = True, False  # never give a GPU to two jobs: this job gets requeued instead
                continue
            # Held even when out of service (the decision may predate the fault in another stream):
            # the holder is displaced and requeued, exactly as when the fault is folded second.
            node.owners[i] = job.id
            if i not in node.gpus or i in node.bad_gpus:
                conflict, clean = True, False
        if not node.in_service:
            conflict = True
        if clean:  # the slot less these GPUs: what refresh_node computes, without recomputing the node
            s.capacity.take_exact(node.nid, p.gpu_indices)
        else:
            s.refresh_node(node)
    key = (job.pool, job.spec.team)
    s.usage[key] = plus(s.usage.get(key, 0), job.gpus)
    s.running.setdefault(key, set()).add(job.id)
    s._add_end(job)
    if (index := _derived_if_built(s)) is not None:
        index.add_running(job)
    if job.spec.preemptible:
        pkey = (job.pool, job.spec.team, job.spec.priority.rank)
        s.preemptible[pkey] = plus(s.preemptible.get(pkey, 0), job.gpus)
    if conflict:
        s.displaced.add(job.id)


def _hold_shares(s: SchedulerState, job: Job, placements: list[Placement]) -> bool:
    """Fold a job's shares of GPUs (on nodes not yet discovered: when they are); True on a conflict.
    It holds its placements' GPU-equivalents (a MIG share is the placed model's)."""
    job.gpus = round(sum(p.gpu_equivalents for p in placements), 6)
    conflict = False
    for p in placements:
        node = s.nodes.get((p.cluster, p.node))
        if node is None:
            s.share_claims.setdefault((p.cluster, p.node), {})[job.id] = None
        else:
            conflict = _hold_share(s, node, job, p) or conflict
    return conflict


def _hold_share(s: SchedulerState, node: Node, job: Job, p: Placement) -> bool:
    """Fold a placement of part of a GPU; True where it conflicts (the job is displaced and requeued):
    a GPU held whole, another mode, no room, an illegal MIG start, or hardware out of service."""
    share = job.spec.share
    assert share is not None
    mode = mode_of(share)
    conflict = not node.in_service
    for i in p.gpu_indices:
        part = holding(p, share, node.gpus.get(i, ""))
        if i not in node.gpus or i in node.bad_gpus:
            conflict = True
        if i in node.owners or part is None:
            conflict = True
            continue
        sg = node.shared.get(i)
        if sg is None:
            sg = node.shared[i] = SharedGpu(mode)
            s.shared_nodes[node.nid] = None
        elif not room(sg, mode, *part, node.gpu_memory.get(i)):
            conflict = True  # never more than one GPU's worth, nor two modes, on one GPU
            continue
        sg.add(job.id, *part)
    s.refresh_node(node)
    return conflict


def _drop_claims(s: SchedulerState, job_id: str, p: Placement) -> None:
    """A job gives back what it claimed on a node not discovered (or forgotten); a node with no claim
    left has no entry, so a forgotten node's name is not kept."""
    where = (p.cluster, p.node)
    shares = s.share_claims.get(where, {})
    shares.pop(job_id, None)
    claims = s.claims.get(where, {})
    for i in p.gpu_indices:
        if claims.get(i) == job_id:
            del claims[i]
    if not shares:
        s.share_claims.pop(where, None)
    if not claims:
        s.claims.pop(where, None)


def _release(s: SchedulerState, job: Job) -> None:
    """Give back what a running job holds."""
    if job.state != JobState.RUNNING:
        return
    for p in job.placements:
        node = s.nodes.get((p.cluster, p.node))
        if node is None:
            _drop_claims(s, job.id, p)
            continue
        for i in p.gpu_indices:
            if node.owners.get(i) == job.id:
                del node.owners[i]
            if (sg := node.shared.get(i)) is not None and job.id in sg.holders:
                sg.drop(job.id)
                if not sg.holders:
                    del node.shared[i]
                    if not node.shared:
                        s.shared_nodes.pop(node.nid, None)
        s.refresh_node(node)
    key = (job.pool, job.spec.team)
    s.usage[key] = plus(s.usage.get(key, 0), -job.gpus)
    s.running.get(key, set()).discard(job.id)
    s._drop_end(job)
    if (index := _derived_if_built(s)) is not None:
        index.drop_running(job)
    if job.spec.preemptible:
        pkey = (job.pool, job.spec.team, job.spec.priority.rank)
        s.preemptible[pkey] = plus(s.preemptible.get(pkey, 0), -job.gpus)
    s.displaced.discard(job.id)
    job.placements = []
    job.borrowed_gpus = 0
    if job.spec.share is not None:
        job.gpus = equivalents(job.spec)
    job.pool_fixed = False
    job.pool = job_pool(job.spec, s.team_pools)
    s.capacity_epoch += 1


def _scheduled(s: SchedulerState, e: JobScheduled) -> None:
    job = s.jobs.get(e.job_id)
    if job is not None:
        _hold(s, job, e.placements, e.at, e.borrowed_gpus, e.reason or "scheduled", e.pool)


def _resumed(s: SchedulerState, e: JobResumed) -> None:
    job = s.jobs.get(e.job_id)
    if job is not None:
        _hold(s, job, e.placements, e.at, e.borrowed_gpus, e.reason or "resumed", e.pool)


def _started(s: SchedulerState, e: JobStarted) -> None:
    job = s.jobs.get(e.job_id)
    if job is not None and job.state == JobState.RUNNING:
        job.started_at = e.at
        index = _derived_if_built(s)
        if index is not None and (costs := index.costs.get((job.pool, job.spec.team, job.spec.priority.rank))):
            costs.started(job)


def _suspend(s: SchedulerState, job: Job, reason: str, at: float) -> None:
    if job.state != JobState.RUNNING:
        return
    _release(s, job)
    job.queued_since = at
    job.state = JobState.SUSPENDED
    job.generation += 1
    job.reason = reason
    s._enqueue(job)


def _preempted(s: SchedulerState, e: JobPreempted) -> None:
    job = s.jobs.get(e.job_id)
    if job is None or job.state != JobState.RUNNING:
        return
    job.preempted_by = e.preemptor_job_id
    job.preempt_reason = e.reason.value
    job.preemptions += 1
    _suspend(s, job, e.detail or f"preempted ({e.reason.value})", e.at)


def _suspended(s: SchedulerState, e: JobSuspended) -> None:
    job = s.jobs.get(e.job_id)
    if job is not None:
        _suspend(s, job, e.reason or "suspended", e.at)


REQUEUED = "requeued: "  # a requeued job's reason until it is placed again (the placement says it moved)


def _requeued(s: SchedulerState, e: JobRequeued) -> None:
    job = s.jobs.get(e.job_id)
    if job is None or job.state != JobState.RUNNING:
        return
    _release(s, job)
    job.queued_since = e.at
    job.state = JobState.PENDING
    job.generation += 1
    job.reason = f"{REQUEUED}{e.reason}"
    s._enqueue(job)


def _finish(s: SchedulerState, job_id: str, state: JobState, at: float, reason: str) -> None:
    job = s.jobs.get(job_id)
    if job is None or job.state in FINISHED:
        return
    if job.state in QUEUED:
        s._dequeue(job)
        s.capacity_epoch += 1  # a reservation may have been held for it
    _release(s, job)
    job.state = state
    job.finished_at = at
    job.reason = reason
    if s.retention_s is None:
        return
    keep = s.retention_s
    if keep == 0 and job.spec.namespace:
        keep = KUBERNETES_KEEP_S
    if keep > 0:
        heapq.heappush(s.finished_heap, (at + keep, job_id))
    else:
        del s.jobs[job_id]  # leaves at once
        s.forgotten += 1


def _completed(s: SchedulerState, e: JobCompleted) -> None:
    _finish(s, e.job_id, JobState.COMPLETED, e.at, "completed")


def _failed(s: SchedulerState, e: JobFailed) -> None:
    _finish(s, e.job_id, JobState.FAILED, e.at, f"failed: {e.reason}")


def _cancelled(s: SchedulerState, e: JobCancelled) -> None:
    by = f" by {e.by}" if e.by else ""
    _finish(s, e.job_id, JobState.CANCELLED, e.at, f"cancelled{by}" + (f": {e.reason}" if e.reason else ""))


# -- fleet -------------------------------------------------------------------------------------
def _gpus(infos: list[GpuInfo]) -> dict[int, str]:
    return {g.index: g.model for g in infos}


def _displace_holders(s: SchedulerState, node: Node, indices: list[int] | None = None) -> None:
    for i, job_id in node.owners.items():
        if indices is None or i in indices:
            s.displaced.add(job_id)
    for i, sg in node.shared.items():
        if indices is None or i in indices:
            s.displaced.update(sg.holders)


def _settle_holders(s: SchedulerState, node: Node) -> None:
    """A node or GPU came back: its holders are no longer displaced if all they hold is in service.
    (So `displaced` is a function of the folded facts, whichever stream was folded first.)"""
    for job_id in set(node.owners.values()).union(*(sg.holders for sg in node.shared.values())):
        job = s.jobs.get(job_id)
        if job_id in s.displaced and job is not None and _in_service(s, job):
            s.displaced.discard(job_id)


def _in_service(s: SchedulerState, job: Job) -> bool:
    for p in job.placements:
        node = s.nodes.get((p.cluster, p.node))
        if node is None or not node.in_service:
            return False
        if any(i in node.bad_gpus or i not in node.gpus or not holds(node, i, job.id) for i in p.gpu_indices):
            return False
    return True


def holds(node: Node, gpu: int, job_id: str) -> bool:
    """The job holds the GPU, whole or a share of it."""
    return node.owners.get(gpu) == job_id or ((sg := node.shared.get(gpu)) is not None and job_id in sg.holders)


def _uuids(infos: list[GpuInfo]) -> dict[int, str]:
    return {g.index: g.uuid for g in infos if g.uuid}


def _memory(infos: list[GpuInfo]) -> dict[int, int]:
    return {g.index: int(g.memory_total_mib) for g in infos if g.memory_total_mib}


def _discovered(s: SchedulerState, e: NodeDiscovered) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is None:
        nid = s.free_nids.pop() if s.free_nids else len(s.node_by_id)
        node = Node(nid=nid, cluster=e.cluster, name=e.node, gpus=_gpus(e.gpus), labels=dict(e.labels))
        node.gpu_memory, node.gpu_uuids = _memory(e.gpus), _uuids(e.gpus)
        node.cpu_milli, node.memory_mib = e.cpu_milli, e.memory_mib
        s.nodes[(e.cluster, e.node)] = node
        if nid < len(s.node_by_id):
            s.node_by_id[nid] = node
        else:
            s.node_by_id.append(node)
        for job_id in s.share_claims.pop((e.cluster, e.node), {}):
            if (job := s.jobs.get(job_id)) is not None and job.state == JobState.RUNNING:
                here = [p for p in job.placements if (p.cluster, p.node) == (e.cluster, e.node)]
                if any([_hold_share(s, node, job, p) for p in here]):  # every placement folded, then judged
                    s.displaced.add(job_id)
        for i, job_id in s.claims.pop((e.cluster, e.node), {}).items():
            node.owners[i] = job_id
            if i not in node.gpus or i in node.shared:
                s.displaced.add(job_id)
    else:  # rediscovered after being lost
        node.gpus, node.labels, node.lost, node.status = _gpus(e.gpus), dict(e.labels), False, NodeStatus.HEALTHY
        node.gpu_memory, node.gpu_uuids = _memory(e.gpus), _uuids(e.gpus)
        node.cpu_milli, node.memory_mib = e.cpu_milli, e.memory_mib
        _settle_holders(s, node)
    _note_managed(s, node)
    s.refresh_node(node)
    s.capacity_epoch += 1


def _note_managed(s: SchedulerState, node: Node) -> None:
    """A node that carries the GPU Operator's mig.config label is the MIG planner's to change."""
    if managed(node):
        s.mig_nodes[node.nid] = None


def _updated(s: SchedulerState, e: NodeUpdated) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is None:
        _discovered(s, NodeDiscovered(cluster=e.cluster, node=e.node, at=e.at, gpus=e.gpus, labels=e.labels))
        node = s.nodes[(e.cluster, e.node)]
    node.gpus, node.status, node.gpu_memory = _gpus(e.gpus), e.status, _memory(e.gpus)
    node.gpu_uuids = _uuids(e.gpus)
    node.cpu_milli, node.memory_mib = e.cpu_milli, e.memory_mib
    if e.labels:
        node.labels = dict(e.labels)
        _note_managed(s, node)
    node.lost = e.status == NodeStatus.LOST
    gone = [i for i in [*node.owners, *node.shared] if i not in node.gpus]
    if node.lost or gone:
        _displace_holders(s, node, None if node.lost else gone)
    elif node.in_service:
        _settle_holders(s, node)
    s.refresh_node(node)
    s.capacity_epoch += 1


def _lost(s: SchedulerState, e: NodeLost) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None:
        node.lost = True
        node.out_reason, node.out_faults = e.reason or "node lost", ()
        _displace_holders(s, node)
        s.refresh_node(node)


def _forgotten(s: SchedulerState, e: NodeForgotten) -> None:
    """The node left the fleet for good: it leaves the state. It was lost first, so its holders were
    displaced then; one the scheduler has not requeued yet keeps its GPUs as a claim on a node not
    discovered (as when JOBS runs ahead of FLEET), stays displaced, and gives them back when it
    leaves. Its id goes to the next node discovered; until then a bare lost node holds it."""
    key = (e.cluster, e.node)
    node = s.nodes.pop(key, None)
    if node is None:
        return
    node.lost = True
    _displace_holders(s, node)
    for i, job_id in node.owners.items():
        s.claims.setdefault(key, {})[i] = job_id
    for sg in node.shared.values():
        for job_id in sg.holders:
            s.share_claims.setdefault(key, {})[job_id] = None
    s.shared_nodes.pop(node.nid, None)
    s.mig_nodes.pop(node.nid, None)
    s.refresh_node(node)  # out of service: its slot offers nothing, under the class it had
    node.gpus, node.labels, node.owners, node.shared, node.mig = {}, {}, {}, {}, {}
    node.bad_gpus, node.gpu_out, node.held, node.gpu_memory, node.gpu_uuids = set(), {}, {}, {}, {}
    s.free_nids.append(node.nid)
    s.__dict__.pop("_derived", None)  # indexes by node id and by node: built again on first use
    s.capacity_epoch += 1


def _node_isolated(s: SchedulerState, e: NodeIsolated) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None:
        node.held.pop(None, None)  # confirmed (or isolated anyway): no longer only held
        node.isolated = True
        node.out_reason, node.out_faults = e.reason, tuple(e.fault_ids)
        _displace_holders(s, node)
        s.refresh_node(node)


def _node_restored(s: SchedulerState, e: NodeRestored) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None:
        node.isolated = False
        node.out_reason, node.out_faults = "", ()
        _settle_holders(s, node)
        s.refresh_node(node)
        s.capacity_epoch += 1


def _gpu_isolated(s: SchedulerState, e: GpuIsolated) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None:
        node.held.pop(e.gpu_index, None)
        node.bad_gpus.add(e.gpu_index)
        node.gpu_out[e.gpu_index] = (e.reason, tuple(e.fault_ids))
        _displace_holders(s, node, [e.gpu_index])
        s.refresh_node(node)


def _gpu_restored(s: SchedulerState, e: GpuRestored) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None:
        node.bad_gpus.discard(e.gpu_index)
        node.gpu_out.pop(e.gpu_index, None)
        _settle_holders(s, node)
        s.refresh_node(node)
        s.capacity_epoch += 1


def _isolation_held(s: SchedulerState, e: IsolationHeld) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None:
        node.held[e.gpu_index] = e.reason  # health's target: a GPU, or None for the whole node
        s.refresh_node(node)


def _isolation_dismissed(s: SchedulerState, e: IsolationDismissed) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is not None and node.held.pop(e.gpu_index, None) is not None:
        s.refresh_node(node)
        s.capacity_epoch += 1


# -- quota -------------------------------------------------------------------------------------
def _rules_changed(s: SchedulerState) -> None:
    """Pools or quotas changed: re-derive pending jobs' pools, node classes and the queue."""
    for job in s.jobs.values():
        if not job.pool_fixed:
            job.pool = job_pool(job.spec, s.team_pools)
    for node in s.node_by_id:
        s.refresh_node(node)
    s.reorder()
    s.capacity_epoch += 1


def _pool_defined(s: SchedulerState, e: PoolDefined) -> None:
    s.pools[e.pool] = PoolDef(e.pool, e.gpu_model, dict(e.node_selector))
    _rules_changed(s)


def _pool_removed(s: SchedulerState, e: PoolRemoved) -> None:
    """The pool goes with its quotas (0 GPUs each: the quota service refuses otherwise)."""
    s.pools.pop(e.pool, None)
    for pool, team in [k for k in s.quotas if k[0] == e.pool]:
        del s.quotas[(pool, team)]
        s.team_pools[team] = sorted(p for (p, t) in s.quotas if t == team)
        if not s.team_pools[team]:
            del s.team_pools[team]
    _rules_changed(s)


def _quota_set(s: SchedulerState, e: TeamQuotaSet) -> None:
    s.quotas[(e.pool, e.team)] = Quota(
        e.team, e.pool, e.guaranteed_gpus, e.borrow_limit, e.lend_limit, e.weight, e.critical, e.np_lend_limit
    )
    s.team_pools[e.team] = sorted(p for (p, t) in s.quotas if t == e.team)
    _rules_changed(s)


def _fair_share(s: SchedulerState, e: FairShareUpdated) -> None:
    if s.fair_share.get((e.pool, e.team)) != e.factor:
        s.fair_share[(e.pool, e.team)] = e.factor
        s.reorder()
        s.capacity_epoch += 1


def _fault(s: SchedulerState, e: GpuFaultDetected) -> None:
    fold_fault(s.links, e)  # NIC faults keep gangs off the node for a while
    fold_kind(s.links, e)  # degrading faults: a job they displace moves only where it lands


# each handler takes its own event type: the dict is keyed by that type, so the call is checked there
_HANDLERS: dict[type[Event], Callable[[SchedulerState, Any], None]] = {
    JobSubmitted: _submitted,
    JobScheduled: _scheduled,
    JobResumed: _resumed,
    JobStarted: _started,
    JobPreempted: _preempted,
    JobSuspended: _suspended,
    JobRequeued: _requeued,
    JobCompleted: _completed,
    JobFailed: _failed,
    JobCancelled: _cancelled,
    NodeDiscovered: _discovered,
    NodeUpdated: _updated,
    NodeLost: _lost,
    NodeForgotten: _forgotten,
    NodeIsolated: _node_isolated,
    NodeRestored: _node_restored,
    GpuIsolated: _gpu_isolated,
    GpuRestored: _gpu_restored,
    IsolationHeld: _isolation_held,
    IsolationDismissed: _isolation_dismissed,
    PoolDefined: _pool_defined,
    PoolRemoved: _pool_removed,
    TeamQuotaSet: _quota_set,
    FairShareUpdated: _fair_share,
    BudgetSet: fold_budget_set,
    BudgetExceeded: fold_budget_exceeded,
    JobSlowdownDetected: lambda s, e: fold_slowdown(s.links, e),
    JobSlowdownCleared: lambda s, e: fold_cleared(s.links, e),
    GpuFaultDetected: _fault,
    JobIdleDetected: fold_idle_detected,
    JobResumeRequested: fold_resume_requested,
    MigLayoutPlanned: fold_planned,
    MigLayoutApplied: fold_applied,
    MigChangeAbandoned: fold_abandoned,
}

_JOB_EVENTS = frozenset(
    {
        JobSubmitted,
        JobScheduled,
        JobResumed,
        JobStarted,
        JobPreempted,
        JobSuspended,
        JobRequeued,
        JobCompleted,
        JobFailed,
        JobCancelled,
    }
)

__all__ = [
    "DEFAULT_POOL",
    "FINISHED",
    "QUEUED",
    "Job",
    "JobState",
    "Node",
    "Quota",
    "SchedulerState",
    "Shape",
    "evolve",
    "shape_of",
]
