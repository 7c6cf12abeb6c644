"""The job-performance core: is a running multi-node job slow, and which GPU, NIC or link is to blame?

Pure: `evolve(state, event)` folds JOBS (placements, own verdicts), TELEMETRY (GPU and fabric samples)
and the shell's own FAULTS decisions in; `decide(state, now)` only reads and says what to publish. Time
comes from the events (sample times), so a replay gives the same verdicts.

Method (shared/reference/fabric.md: Minder, nvidia-resiliency-ext, ByteRobust):
1. Speed against its own best: the job's collective progress (NCCL RAS op counts; the ranks' NIC traffic
   where RAS is absent) over a 5 s window, divided by the best it has shown. score < SLOW_SCORE is slow.
2. Peer comparison across the job's ranks: a NIC down, flapping, trained below its peers or erroring; a
   GPU whose clock is below its peers' or that is busy while its peers wait; pause frames across several
   nodes under one leaf switch (shared congestion: `fabric`, not a node fault).
3. Persistence: slow for PERSIST_S with the same culprit for CANDIDATE_S before a verdict; a slowdown
   with no diverging signal and no culprit waits UNKNOWN_PERSIST_S. A job that is slower while its GPUs
   stay busy is in another phase (eval, checkpoint): no verdict, and its best re-bases after PHASE_S.
4. A GPU or NIC culprit is also a `straggler` fault on FAULTS, again every RECONFIRM_S while the episode
   lasts: the health policy isolates a culprit confirmed twice within 5 minutes (ByteRobust's rule).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from events.base import Event
from events.codec import stable_id
from events.fabric import (
    CulpritKind,
    DeadPeer,
    FabricSample,
    JobSlowdownCleared,
    JobSlowdownDetected,
    LinkState,
    NicSample,
)
from events.faults import FaultKind, GpuFaultDetected, Severity
from events.fleet import NodeDiscovered, NodeForgotten, NodeUpdated
from events.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSuspended,
)
from events.steps import RankStepTimings
from events.telemetry import NodeInventory, NodeSample
from services.perf import steps as step_table
from services.timefmt import iso

WINDOW_S = 5.0  # progress rate window
WARMUP_S = 10.0  # a job's best needs this much history first
SLOW_SCORE = 0.85  # slower than 85 % of its own best
RECOVERED_SCORE = 0.95
PERSIST_S = 5.0
CANDIDATE_S = 3.0
UNKNOWN_PERSIST_S = 20.0
PHASE_S = 30.0
CLEAR_S = 10.0
RECONFIRM_S = 60.0
BUSY_SHARE = 0.85  # ranks still this busy (vs. their busiest at best speed): another phase, not a fault
CLOCK_RATIO = 0.85  # a GPU clocked below 85 % of its peers' median
BUSY_GAP_PCT = 25.0  # a GPU busy this many points above its peers' median while they wait
NIC_RATE_RATIO = 0.75
ERRORS_PER_S = 5.0
FLAP_MEMORY_S = 30.0
PAUSE_PER_S = 1000.0  # pause frames per second per NIC (mean over the node's NICs): congestion
BUSBW_RATIO = 0.6  # NCCL Inspector: a rank under 60 % of its communicator's median bus bandwidth
MIN_BUSBW_PEERS = 3
RAS_HANG_QUERIES = 3  # node_agent/ras_watch.py HANG_QUERIES: counts frozen across 3 RAS queries
STALE_S = 5.0  # a node sample older than this does not speak for the node
HEAT_KEPT = 300  # per-rank activity kept per job (one per evaluation): `chamber perf JOB`

NodeKey = tuple[str, str]  # (cluster, node)


@dataclass(frozen=True)
class Culprit:
    kind: CulpritKind
    node: NodeKey | None = None
    gpu: int | None = None
    nic: str | None = None
    leaf: str | None = None
    confidence: float = 0.5
    evidence: tuple[tuple[str, float | str], ...] = ()
    reason: str = ""
    gpus: tuple[int, ...] = ()  # every GPU of the culprit (a tensor-parallel worker); () = just `gpu`
    ranks: tuple[int, ...] = ()  # global ranks (from step timings)
    pattern: str = ""  # slow_worker | stage_imbalance | data_imbalance | nccl_hang | "" (samples alone)
    score: float | None = None  # the speed the verdict rests on, when not the job's own-best score
    since: float | None = None

    def identity(self) -> tuple[object, ...]:
        return (self.kind, self.node, self.gpu, self.nic, self.leaf, self.gpus, self.pattern)

    def all_gpus(self) -> tuple[int, ...]:
        return self.gpus or ((self.gpu,) if self.gpu is not None else ())


@dataclass
class NodeView:
    t: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    gpus: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)  # index -> (util, clock)
    fabric_t: float = 0.0
    nics: dict[int, NicSample] = field(default_factory=dict)  # by the GPU it serves (or its index)
    flaps: dict[int, float] = field(default_factory=dict)  # rail -> last time it flapped
    errors: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    pause_per_nic_s: float = 0.0
    collectives: dict[tuple[str, str, str], dict[int, float]] = field(default_factory=dict)  # Inspector busbw


@dataclass
class Episode:
    number: int
    since: float
    culprit: Culprit | None = None
    confirms: int = 0
    last_confirm: float | None = None


@dataclass
class Moved:
    """A slow job the scheduler moved: its episode's outcome, shown by `chamber perf` while the job
    lives (waiting to resume, then running on its new place) instead of vanishing with the move."""

    episode: int
    culprit: str  # where the episode blamed ("n3 NIC mlx5_0/1"), "" when it named no part
    at: float
    why: str  # the scheduler's reason
    resumed_on: tuple[str, ...] = ()
    resumed_at: float | None = None

    def outcome(self) -> str:
        off = f" off {self.culprit}" if self.culprit else ""
        moved = f"episode {self.episode}: moved{off} at {iso(self.at)} ({self.why})"
        if self.resumed_at is None:
            return f"{moved}; waiting to resume"
        return f"{moved}; resumed on {', '.join(self.resumed_on)} at {iso(self.resumed_at)}"


@dataclass
class JobTrack:
    job_id: str
    placements: dict[NodeKey, tuple[int, ...]]
    started: float
    progress: dict[NodeKey, deque[tuple[float, int]]] = field(default_factory=dict)
    traffic: deque[tuple[float, float]] = field(default_factory=deque)  # (t, the ranks' tx bytes/s): no RAS
    heat: deque[tuple[float, tuple[float | None, ...]]] = field(default_factory=lambda: deque(maxlen=HEAT_KEPT))
    last_eval: float = float("-inf")
    rate: float | None = None
    best: float = 0.0
    util_best: float = 0.0
    score: float = 1.0
    slow_since: float | None = None
    candidate: Culprit | None = None
    candidate_since: float = 0.0
    phase_since: float | None = None
    healthy_since: float | None = None
    ready: Culprit | None = None
    verdict: str = "warming"  # warming | healthy | slow | phase
    t: float = 0.0
    steps: step_table.StepTrack | None = None  # the job reports per-rank step timings
    step_ready: Culprit | None = None  # the step table's verdict (services/perf/steps.py)
    hung: dict[NodeKey, list[str]] = field(default_factory=dict)  # RAS: frozen communicators per node
    hang: Culprit | None = None

    def culprit_now(self) -> Culprit | None:
        """The verdict to act on. A job that reports its steps is judged by them (peers doing the same
        work, no history needed); samples still win with hard fabric evidence (a NIC down, a congested
        leaf), which a step table cannot see. Without step timings: the samples' verdict."""
        hard = self.ready is not None and self.ready.kind in (CulpritKind.NIC, CulpritKind.FABRIC)
        if self.hang is not None and not hard:
            return self.hang  # collectives stopped: nothing else the job shows matters until they move
        if self.steps is None:
            return self.ready
        if hard and (self.step_ready is None or self.step_ready.pattern == "slow_worker"):
            return self.ready
        return self.step_ready

    def ranks(self) -> list[tuple[NodeKey, int]]:
        return [(n, g) for n in sorted(self.placements) for g in self.placements[n]]


@dataclass
class PerfState:
    nodes: dict[NodeKey, NodeView] = field(default_factory=dict)
    jobs: dict[str, JobTrack] = field(default_factory=dict)
    episodes: dict[str, Episode] = field(default_factory=dict)  # open episodes by job
    last_episode: dict[str, int] = field(default_factory=dict)
    closed: dict[str, float] = field(default_factory=dict)  # job -> when its last episode ended
    stopped: dict[str, float] = field(default_factory=dict)  # open episodes of jobs that stopped
    history: dict[str, list[str]] = field(default_factory=dict)  # what happened, for `chamber explain`
    moved: dict[str, Moved] = field(default_factory=dict)  # jobs moved while slow, until they finish
    node_jobs: dict[NodeKey, set[str]] = field(default_factory=dict)  # index: the jobs running on a node
    addresses: dict[str, NodeKey] = field(default_factory=dict)  # a node's IP -> the node (RAS names hosts)
    dead_pending: dict[str, tuple[NodeKey, DeadPeer]] = field(default_factory=dict)  # fault id -> peer
    dead_reported: set[str] = field(default_factory=set)
    # Straggler reports (FAULTS) folded before their episode's JobSlowdownDetected (JOBS): two streams,
    # so a replay or a live race may bring the report first. (job, episode) -> the reports' times,
    # counted when the episode opens, as if they had come after it.
    early_confirms: dict[tuple[str, int], list[float]] = field(default_factory=dict)


def _node(state: PerfState, cluster: str, node: str) -> NodeView:
    return state.nodes.setdefault((cluster, node), NodeView())


def evolve(state: PerfState, event: Event) -> PerfState:
    """Fold one event in (mutates and returns `state`; never raises on a valid event)."""
    match event:
        case NodeSample():
            v = _node(state, event.cluster, event.node)
            v.t = event.observed_at
            v.gpus = {
                g.index: (g.sm_activity_pct if g.sm_activity_pct is not None else g.utilization_pct, g.sm_clock_mhz)
                for g in event.gpus
            }
        case FabricSample():
            _on_fabric(state, event)
        case RankStepTimings():
            _on_steps(state, event)
        case NodeInventory():
            if event.labels:
                _node(state, event.cluster, event.node).labels.update(event.labels)
        case NodeDiscovered() | NodeUpdated():
            if event.labels:
                _node(state, event.cluster, event.node).labels.update(event.labels)
        case NodeForgotten():  # left the fleet for good: its samples, NICs and addresses go with it
            key = (event.cluster, event.node)
            state.nodes.pop(key, None)
            for addr in [a for a, k in state.addresses.items() if k == key]:
                del state.addresses[addr]
        case JobScheduled() | JobResumed():
            placements = {(p.cluster, p.node): tuple(sorted(p.gpu_indices)) for p in event.placements}
            _untrack(state, event.job_id)
            state.jobs[event.job_id] = JobTrack(event.job_id, placements, started=event.at, t=event.at)
            for key in placements:
                state.node_jobs.setdefault(key, set()).add(event.job_id)
            _resumed(state, event.job_id, sorted({node for _, node in placements}), event.at)
        case JobPreempted() | JobSuspended() | JobRequeued() | JobCompleted() | JobFailed() | JobCancelled():
            if isinstance(event, JobCompleted | JobFailed | JobCancelled):
                state.moved.pop(event.job_id, None)
            if _untrack(state, event.job_id) is not None and event.job_id in state.episodes:
                state.stopped[event.job_id] = event.at
                if isinstance(event, JobRequeued):
                    _moved(state, event.job_id, event.at, event.reason)
                elif isinstance(event, JobPreempted):
                    _moved(state, event.job_id, event.at, event.detail or f"preempted ({event.reason.value})")
        case JobSlowdownDetected():
            state.last_episode[event.job_id] = max(event.episode, state.last_episode.get(event.job_id, 0))
            track = state.jobs.get(event.job_id)
            best = event.evidence.get("best_rate")
            if track is not None and isinstance(best, int | float):
                # A restarted service learns the job's best from its own verdict, not from the slow
                # samples it sees now (which would look "as good as ever" and clear the episode).
                track.best = max(track.best, float(best))
            culprit = None
            if track is not None and track.culprit_now() is not None:
                culprit = track.culprit_now()
            elif event.node is not None and event.cluster is not None:
                culprit = Culprit(event.culprit, (event.cluster, event.node), event.gpu_index, event.nic, event.leaf)
            state.episodes[event.job_id] = Episode(event.episode, event.since, culprit)
            where = " ".join(
                str(x)
                for x in (
                    event.node,
                    f"GPU {event.gpu_index}" if event.gpu_index is not None else None,
                    event.nic and f"NIC {event.nic}",
                    event.leaf,
                )
                if x
            )
            _note(
                state,
                event.job_id,
                f"{event.at:.0f}: slow (episode {event.episode}, {event.score:.0%} of its best since "
                f"{event.since:.0f}), culprit {event.culprit.value} {where}: {event.reason}",
            )
            for at in state.early_confirms.pop((event.job_id, event.episode), []):
                _confirm(state, event.job_id, state.episodes[event.job_id], at)
        case JobSlowdownCleared():
            if (ep := state.episodes.get(event.job_id)) is not None and ep.number == event.episode:
                del state.episodes[event.job_id]
                state.closed[event.job_id] = event.at
            _note(state, event.job_id, f"{event.at:.0f}: episode {event.episode} cleared ({event.reason})")
            state.stopped.pop(event.job_id, None)
        case GpuFaultDetected() if event.kind is FaultKind.NCCL_PEER_DEAD:
            state.dead_pending.pop(event.fault_id, None)
            state.dead_reported.add(event.fault_id)
        case GpuFaultDetected() if event.kind is FaultKind.STRAGGLER:
            job = event.detail.partition(" ")[0]
            number = _episode_of(event.fault_id)
            ep = state.episodes.get(job)
            if ep is not None and number in (None, ep.number):
                _confirm(state, job, ep, event.observed_at)
            elif number is not None and number > state.last_episode.get(job, 0):
                state.early_confirms.setdefault((job, number), []).append(event.observed_at)
    return state


def _moved(state: PerfState, job: str, at: float, why: str) -> None:
    ep = state.episodes[job]
    state.moved[job] = Moved(ep.number, _where(ep.culprit), at, why)
    _note(state, job, f"{at:.0f}: moved off its GPUs ({why}); resumes elsewhere")


def _resumed(state: PerfState, job: str, nodes: list[str], at: float) -> None:
    moved = state.moved.get(job)
    if moved is not None and moved.resumed_at is None:
        moved.resumed_on, moved.resumed_at = tuple(nodes), at
        _note(state, job, f"{at:.0f}: resumed on {', '.join(nodes)} after the move (episode {moved.episode})")


def _where(c: Culprit | None) -> str:
    """The part a culprit names, as a person reads it: `n3 NIC mlx5_0/1`, `n3 GPU 2`, `leaf l1`."""
    if c is None:
        return ""
    part = f"NIC {c.nic}" if c.nic else (f"GPU {c.gpu}" if c.gpu is not None else "")
    where = " ".join(x for x in (c.node[1] if c.node else "", part) if x)
    return where or (f"leaf {c.leaf}" if c.leaf else "")


def _episode_of(fault_id: str) -> int | None:
    """The episode a straggler report names: its id is `perf/<job>/<episode>/<n>` (`_straggler`)."""
    parts = fault_id.rsplit("/", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def _confirm(state: PerfState, job: str, ep: Episode, at: float) -> None:
    ep.confirms += 1
    ep.last_confirm = at
    _note(state, job, f"{at:.0f}: culprit reported to health ({ep.confirms}x: straggler)")


HISTORY_KEPT = 20


def _untrack(state: PerfState, job: str) -> JobTrack | None:
    track = state.jobs.pop(job, None)
    if track is not None:
        for key in track.placements:
            jobs = state.node_jobs.get(key)
            if jobs is not None:
                jobs.discard(job)
                if not jobs:
                    del state.node_jobs[key]
    return track


def _note(state: PerfState, job: str, line: str) -> None:
    lines = state.history.setdefault(job, [])
    lines.append(line)
    del lines[:-HISTORY_KEPT]


def explain_lines(state: PerfState, job: str) -> list[str]:
    """Why the job is slow (or was), and what Chamber did about it: for `chamber explain JOB`."""
    lines = list(state.history.get(job, []))
    track = state.jobs.get(job)
    if track is not None:
        lines.append(f"now: {track.verdict}, {track.score:.0%} of its best speed over {len(track.ranks())} ranks")
    return lines


def _on_fabric(state: PerfState, s: FabricSample) -> None:
    key = (s.cluster, s.node)
    v = _node(state, *key)
    t = s.observed_at
    v.fabric_t = t
    if s.labels:
        v.labels.update(s.labels)
    v.nics = {}
    pauses = []
    for n in s.nics:
        rail = n.gpu_index if n.gpu_index is not None else n.index
        v.nics[rail] = n
        if n.flaps:
            v.flaps[rail] = t
        if n.errors:
            v.errors.setdefault(rail, deque()).append((t, n.errors))
        q = v.errors.get(rail)
        while q and q[0][0] <= t - 10.0:
            q.popleft()
        if n.pause is not None:
            pauses.append(n.pause / max(s.interval_s, 1e-9))
    v.pause_per_nic_s = sum(pauses) / len(pauses) if pauses else 0.0
    if s.collectives:
        v.collectives = {}
        for series in s.collectives:
            if series.busbw_gbs is not None:
                where = (series.comm, series.collective, series.message_size)
                v.collectives.setdefault(where, {})[series.gpu_index] = series.busbw_gbs
    for addr in s.addresses:
        state.addresses[addr] = key
    for peer in s.dead_peers:
        _on_dead_peer(state, key, peer)
    here = state.node_jobs.get(key, set())
    touched: set[str] = set()
    for c in s.comms:
        # RAS does not know the job; on a node running one tracked job, its communicators are that job's
        job = c.job if c.job is not None else (next(iter(here)) if len(here) == 1 else None)
        if job is None or (track := state.jobs.get(job)) is None or key not in track.placements:
            continue
        if job not in touched:
            track.hung[key] = []
            touched.add(job)
        if c.frozen_queries >= RAS_HANG_QUERIES and c.ops >= 0 and c.status in ("RUNNING", ""):
            track.hung[key].append(c.comm)
        if c.ops < 0:
            continue  # text-format RAS without counts for this communicator
        q = track.progress.setdefault(key, deque())
        q.append((t, c.ops))
        while len(q) > 2 and q[1][0] <= t - WINDOW_S:
            q.popleft()
    for job in touched:
        _judge_hang(state.jobs[job], t)
    for job in sorted(state.node_jobs.get(key, ())):
        track = state.jobs[job]
        if t - track.last_eval >= 0.9 * s.interval_s:
            _evaluate(state, track, t)


def _on_dead_peer(state: PerfState, reporter: NodeKey, peer: DeadPeer) -> None:
    """A process RAS declared dead: the node it ran on (by its address; the reporting node's cluster)."""
    node = state.addresses.get(peer.host)
    if node is None:
        match = [k for k in state.nodes if k[0] == reporter[0] and k[1] == peer.host]
        node = match[0] if match else None
    if node is None:
        _note_all(state, reporter, f"NCCL RAS: dead peer {peer.host} (pid {peer.pid}) on a node not known by address")
        return
    fault_id = f"perf/peer-dead/{node[1]}/{peer.pid if peer.pid is not None else 'x'}"
    if fault_id in state.dead_reported or fault_id in state.dead_pending:
        return
    state.dead_pending[fault_id] = (node, peer)


def _note_all(state: PerfState, key: NodeKey, line: str) -> None:
    for job in sorted(state.node_jobs.get(key, ())):
        _note(state, job, line)


def _judge_hang(track: JobTrack, t: float) -> None:
    frozen = sorted((k, c) for k, comms in track.hung.items() for c in comms)
    if not frozen:
        track.hang = None
        return
    if track.hang is not None:
        return
    node, comm = frozen[0]
    track.hang = Culprit(
        CulpritKind.UNKNOWN,
        confidence=0.9,
        evidence=(("comm", comm), ("frozen_queries", float(RAS_HANG_QUERIES))),
        reason=(
            f"NCCL communicator {comm} on {node[1]}: collective counts unchanged in {RAS_HANG_QUERIES} RAS "
            f"queries while RUNNING: the job is hung ({len(frozen)} communicator(s) frozen)"
        ),
        pattern="nccl_hang",
        score=0.0,
        since=t,
    )
    track.t = max(track.t, t)


def _on_steps(state: PerfState, e: RankStepTimings) -> None:
    track = state.jobs.get(e.job_id)
    key = (e.cluster, e.node)
    if track is None or key not in track.placements:
        return  # a job the perf service does not track here (not scheduled, or moved)
    if track.steps is None:
        track.steps = step_table.StepTrack(expected=sum(len(g) for g in track.placements.values()))
    gpus = track.placements[key]
    # Ranks fill a node's GPUs in order (torchrun's local rank); a row's own gpu_index wins.
    gpu_of_rank = {row.rank: gpus[row.rank % len(gpus)] for row in e.steps if gpus}
    step_table.fold(track.steps, e, gpu_of_rank)
    if step_table.evaluate(track.steps):
        track.t = max(track.t, track.steps.t)
        track.step_ready = _step_culprit(state, track, track.steps)


def _step_culprit(state: PerfState, track: JobTrack, st: step_table.StepTrack) -> Culprit | None:
    """The step table's finding as a culprit: a slow worker names its node and every GPU, or the NIC of
    one of them when the fabric samples or Inspector flag it; an imbalance names no hardware."""
    f = st.finding
    if f is None:
        return None
    evidence = (*f.evidence, ("steps_from", float(f.since_step)))
    if f.pattern != "slow_worker":
        return Culprit(
            CulpritKind.UNKNOWN,
            confidence=0.8,
            evidence=evidence,
            reason=f.reason,
            ranks=f.ranks,
            pattern=f.pattern,
            score=f.score,
            since=f.since_t,
        )
    node = st.where[f.ranks[0]][0]
    gpus = tuple(sorted({g for r in f.ranks if (w := st.where.get(r)) and w[0] == node and (g := w[1]) is not None}))
    nic = _nic_evidence(state, node, gpus, st.t)
    if nic is None and (link := _busbw_evidence(state, track, node, gpus)) is not None:
        nic = (link.gpu or 0, link.nic or "", "has an outlier bus bandwidth (NCCL Inspector)")
    if nic is not None:
        rail, name, why = nic
        return Culprit(
            CulpritKind.NIC,
            node,
            rail,
            name,
            confidence=0.85,
            evidence=(*evidence, ("nic_evidence", why)),
            reason=f"{f.reason}; NIC {name} on {node[1]} {why}",
            ranks=f.ranks,
            pattern=f.pattern,
            score=f.score,
            since=f.since_t,
        )
    return Culprit(
        CulpritKind.GPU,
        node,
        gpus[0] if gpus else None,
        confidence=0.85,
        evidence=evidence,
        reason=f"{f.reason} (GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))} on {node[1]})",
        gpus=gpus,
        ranks=f.ranks,
        pattern=f.pattern,
        score=f.score,
        since=f.since_t,
    )


def _nic_evidence(state: PerfState, node: NodeKey, gpus: tuple[int, ...], t: float) -> tuple[int, str, str] | None:
    """A NIC serving one of `gpus` that the node's fabric samples flag (down, flapping, trained low,
    erroring) or whose Inspector bus bandwidth is an outlier in its communicator."""
    v = state.nodes.get(node)
    if v is None:
        return None
    rates = [n.rate_gbps for n in v.nics.values() if n.rate_gbps]
    typical = median(rates) if rates else None
    for g in gpus:
        n = v.nics.get(g)
        if n is None:
            continue
        if n.state is LinkState.DOWN:
            return g, n.name, "is down"
        if (last := v.flaps.get(g)) is not None and t - last <= FLAP_MEMORY_S:
            return g, n.name, "flaps"
        if n.rate_gbps and typical and n.rate_gbps < NIC_RATE_RATIO * typical:
            return g, n.name, f"trained at {n.rate_gbps:g} Gb/s, peers {typical:g}"
        q = v.errors.get(g)
        if q and sum(c for _, c in q) / 10.0 >= ERRORS_PER_S:
            return g, n.name, "retransmits"
    return None


def _busbw_evidence(state: PerfState, track: JobTrack, node: NodeKey, gpus: tuple[int, ...]) -> Culprit | None:
    c = inspector_outlier(state, track)
    return c if c is not None and c.node == node and c.gpu in gpus else None


# --- evaluation (inside evolve: the verdict follows the samples) -------------------------------------


def _job_rate(state: PerfState, track: JobTrack, t: float) -> float | None:
    rates = []
    for q in track.progress.values():
        if len(q) >= 2 and t - q[-1][0] <= STALE_S and q[-1][0] - q[0][0] >= WINDOW_S * 0.6:
            d = q[-1][1] - q[0][1]
            rates.append(max(0.0, d) / (q[-1][0] - q[0][0]))
    if rates:
        return median(rates)
    if track.progress:  # RAS reports the job but its window is still filling
        return None
    # No NCCL RAS: the ranks' NIC traffic stands in for progress (bytes per iteration are steady).
    traffic: list[float] = []
    for key, gpus in track.placements.items():
        v = state.nodes.get(key)
        if v is None or t - v.fabric_t > STALE_S:
            continue
        traffic += [v.nics[g].tx_bytes_per_s or 0.0 for g in gpus if g in v.nics]
    if not traffic:
        return None
    # Averaged over the same window as RAS progress: a flapping link's traffic comes and goes.
    window = track.traffic
    window.append((t, sum(traffic)))
    while window and window[0][0] <= t - WINDOW_S:
        window.popleft()
    if t - window[0][0] < WINDOW_S * 0.6:
        return None
    return sum(v for _, v in window) / len(window)


def _mean_util(state: PerfState, track: JobTrack) -> float | None:
    utils = [u for (key, g) in track.ranks() if (u := _gpu(state, key, g)[0]) is not None]
    return sum(utils) / len(utils) if utils else None


def _gpu(state: PerfState, key: NodeKey, gpu: int) -> tuple[float | None, float | None]:
    v = state.nodes.get(key)
    return v.gpus.get(gpu, (None, None)) if v is not None else (None, None)


def _evaluate(state: PerfState, track: JobTrack, t: float) -> None:
    track.last_eval = track.t = t
    track.heat.append((t, tuple(_gpu(state, key, g)[0] for key, g in track.ranks())))
    rate = _job_rate(state, track, t)
    track.rate = rate
    if rate is None:
        return
    util = _mean_util(state, track)
    warm = t - track.started >= WARMUP_S and track.best > 0
    if not warm:
        track.best = max(track.best, rate)
        if util is not None:
            track.util_best = max(track.util_best, util)
        track.verdict = "warming"
        return
    track.score = score = rate / track.best
    if score >= SLOW_SCORE:
        track.slow_since = track.candidate = track.ready = track.phase_since = None
        track.verdict = "healthy"
        if score >= RECOVERED_SCORE:
            track.healthy_since = track.healthy_since if track.healthy_since is not None else t
        else:
            track.healthy_since = None
        if rate > track.best:
            track.best = rate
        if util is not None and score >= RECOVERED_SCORE:
            track.util_best = 0.9 * track.util_best + 0.1 * util if track.util_best else util
        return
    track.healthy_since = None
    track.slow_since = track.slow_since if track.slow_since is not None else t
    culprit = find_culprit(state, track, t)
    busy = util is not None and track.util_best > 0 and util >= BUSY_SHARE * track.util_best
    if culprit is None and busy:
        # Slower, but every rank is still busy computing: another phase of the job, not a fault.
        track.verdict = "phase"
        track.candidate = track.ready = None
        track.phase_since = track.phase_since if track.phase_since is not None else t
        if t - track.phase_since >= PHASE_S:
            track.best, track.util_best = rate, util or track.util_best
            track.slow_since = track.phase_since = None
        return
    track.phase_since = None
    track.verdict = "slow"
    if culprit is None:
        culprit = Culprit(
            CulpritKind.UNKNOWN,
            confidence=0.4,
            evidence=(("mean_util_pct", round(util or 0.0, 1)),),
            reason="slow with no diverging rank, NIC or link; ranks are waiting",
        )
    if track.candidate is None or track.candidate.identity() != culprit.identity():
        track.candidate_since = t
    track.candidate = culprit
    waited = t - track.slow_since
    need = UNKNOWN_PERSIST_S if culprit.kind is CulpritKind.UNKNOWN else PERSIST_S
    track.ready = culprit if waited >= need and t - track.candidate_since >= CANDIDATE_S else None


def find_culprit(state: PerfState, track: JobTrack, t: float) -> Culprit | None:
    """Peer comparison across the job's ranks; the first rule that fires names the culprit."""
    ranks = track.ranks()
    nics: list[tuple[NodeKey, int, NicSample]] = []
    for key, g in ranks:
        v = state.nodes.get(key)
        if v is not None and t - v.fabric_t <= STALE_S and g in v.nics:
            nics.append((key, g, v.nics[g]))
    for key, g, n in nics:
        if n.state is LinkState.DOWN:
            return Culprit(
                CulpritKind.NIC,
                key,
                g,
                n.name,
                confidence=0.95,
                evidence=(("link", "down"),),
                reason=f"NIC {n.name} on {key[1]} is down: the gang cannot complete its collectives",
            )
    for key, g, n in nics:
        last = state.nodes[key].flaps.get(g)
        if last is not None and t - last <= FLAP_MEMORY_S:
            return Culprit(
                CulpritKind.NIC,
                key,
                g,
                n.name,
                confidence=0.9,
                evidence=(("flapped_s_ago", round(t - last, 1)),),
                reason=f"NIC {n.name} on {key[1]} flaps",
            )
    rates = [n.rate_gbps for _, _, n in nics if n.rate_gbps]
    if rates:
        typical = median(rates)
        for key, g, n in nics:
            if n.rate_gbps and n.rate_gbps < NIC_RATE_RATIO * typical:
                return Culprit(
                    CulpritKind.NIC,
                    key,
                    g,
                    n.name,
                    confidence=0.9,
                    evidence=(("rate_gbps", n.rate_gbps), ("peer_rate_gbps", typical)),
                    reason=f"NIC {n.name} on {key[1]} trained at {n.rate_gbps:g} Gb/s, peers {typical:g}",
                )
    worst: tuple[float, NodeKey, int, NicSample] | None = None
    for key, g, n in nics:
        q = state.nodes[key].errors.get(g)
        per_s = sum(c for _, c in q) / 10.0 if q else 0.0
        if per_s >= ERRORS_PER_S and (worst is None or per_s > worst[0]):
            worst = (per_s, key, g, n)
    if worst is not None:
        per_s, key, g, n = worst
        return Culprit(
            CulpritKind.NIC,
            key,
            g,
            n.name,
            confidence=0.85,
            evidence=(("errors_per_s", round(per_s, 1)),),
            reason=f"NIC {n.name} on {key[1]}: {per_s:.0f} errors/s (retransmissions)",
        )
    slow_link = inspector_outlier(state, track)
    if slow_link is not None:
        return slow_link
    congestion = _congestion(state, track, t)
    if congestion is not None:
        return congestion
    gpus = [(key, g, *_gpu(state, key, g)) for key, g in ranks]
    clocks = [c for *_, c in gpus if c]
    utils = [u for *_, u, _ in gpus if u is not None]
    if clocks:
        typical = median(clocks)
        low = [(c, key, g) for key, g, _, c in gpus if c and c < CLOCK_RATIO * typical]
        if low:
            c, key, g = min(low)
            return Culprit(
                CulpritKind.GPU,
                key,
                g,
                confidence=0.9,
                evidence=(("sm_clock_mhz", c), ("peer_clock_mhz", typical)),
                reason=f"GPU {g} on {key[1]} clocked at {c:.0f} MHz, peers {typical:.0f}: a straggler",
            )
    if utils:
        typical = median(utils)
        busy = [(u, key, g) for key, g, u, _ in gpus if u is not None and u - typical >= BUSY_GAP_PCT]
        if len(busy) == 1:
            u, key, g = busy[0]
            return Culprit(
                CulpritKind.GPU,
                key,
                g,
                confidence=0.7,
                evidence=(("util_pct", u), ("peer_util_pct", typical)),
                reason=f"GPU {g} on {key[1]} busy {u:.0f} % while its peers wait ({typical:.0f} %)",
            )
    return None


def inspector_outlier(state: PerfState, track: JobTrack) -> Culprit | None:
    """NCCL Inspector: within one communicator and collective (and message-size bucket), a rank whose
    bus bandwidth is below BUSBW_RATIO x the median of the communicator's ranks points at its NIC or
    link (a GPU does not lower a collective's bus bandwidth for itself alone). Needs MIN_BUSBW_PEERS
    ranks of the job reporting the same series."""
    series: dict[tuple[str, str, str], list[tuple[float, NodeKey, int]]] = {}
    for key, gpus in track.placements.items():
        v = state.nodes.get(key)
        if v is None:
            continue
        for s, per_gpu in v.collectives.items():
            for g, bw in per_gpu.items():
                if g in gpus:
                    series.setdefault(s, []).append((bw, key, g))
    worst: tuple[float, tuple[str, str, str], float, NodeKey, int] | None = None
    for s, members in sorted(series.items()):
        if len(members) < MIN_BUSBW_PEERS:
            continue
        typical = median(bw for bw, _, _ in members)
        bw, key, g = min(members)
        if typical > 0 and bw < BUSBW_RATIO * typical and (worst is None or bw / typical < worst[0]):
            worst = (bw / typical, s, typical, key, g)
    if worst is None:
        return None
    share, (comm, coll, size), typical, key, g = worst
    n = state.nodes[key].nics.get(g)
    name = n.name if n is not None else f"rail {g}"
    return Culprit(
        CulpritKind.NIC,
        key,
        g,
        name,
        confidence=0.8,
        evidence=(("busbw_share", round(share, 3)), ("peer_busbw_gbs", round(typical, 1)), ("comm", comm)),
        reason=(
            f"NCCL Inspector: GPU {g} on {key[1]} reaches {share:.0%} of its peers' bus bandwidth in {coll} "
            f"{size} on {comm} ({typical:.0f} GB/s): its NIC or link"
        ),
    )


def _congestion(state: PerfState, track: JobTrack, t: float) -> Culprit | None:
    """Pause frames on the job's nodes: several nodes under one leaf -> shared congestion (fabric); one
    node alone -> its NICs (nic)."""
    paused = [
        k
        for k in track.placements
        if (v := state.nodes.get(k)) and t - v.fabric_t <= STALE_S and v.pause_per_nic_s >= PAUSE_PER_S
    ]
    if not paused:
        return None
    leaves: dict[str, list[NodeKey]] = {}
    for key, v in state.nodes.items():
        leaf = v.labels.get("leaf")
        if leaf and t - v.fabric_t <= STALE_S and v.pause_per_nic_s >= PAUSE_PER_S:
            leaves.setdefault(leaf, []).append(key)
    for leaf, members in sorted(leaves.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(members) >= 2 and any(k in members for k in paused):
            rate = median(state.nodes[k].pause_per_nic_s for k in members)
            return Culprit(
                CulpritKind.FABRIC,
                leaf=leaf,
                confidence=0.8,
                evidence=(("paused_nodes", float(len(members))), ("pause_per_nic_s", round(rate, 1))),
                reason=f"pause frames on {len(members)} nodes under {leaf}: shared congestion, not one node",
            )
    key = paused[0]
    v = state.nodes[key]
    rail, nic = max(v.nics.items(), key=lambda kv: (kv[1].pause or 0, -kv[0]))
    return Culprit(
        CulpritKind.NIC,
        key,
        rail,
        nic.name,
        confidence=0.6,
        evidence=(("pause_per_nic_s", round(v.pause_per_nic_s, 1)),),
        reason=f"pause frames on {key[1]} alone",
    )


# --- decide ------------------------------------------------------------------------------------------


def decide(state: PerfState, now: float) -> list[tuple[Event, str]]:
    """Verdicts to publish, each with its deterministic id; fold them back in with `evolve` once
    published. Only reads `state`. Sorted by job id."""
    out: list[tuple[Event, str]] = []
    for fault_id, (node, peer) in sorted(state.dead_pending.items()):
        out.append((_peer_dead_fault(fault_id, node, peer, now), fault_id))
    for job in sorted(set(state.jobs) | set(state.episodes)):
        track, ep = state.jobs.get(job), state.episodes.get(job)
        if ep is not None and (track is None or job in state.stopped):
            at = state.stopped.get(job, now)
            out.append(_cleared(job, ep, at, "stopped"))
            continue
        if track is None:
            continue
        ready = track.culprit_now()
        if ep is None and ready is not None:
            number = state.last_episode.get(job, 0) + 1
            det = _detected(track, ready, number)
            out.append((det, stable_id("perf", "detected", job, number)))
            if ready.kind in (CulpritKind.GPU, CulpritKind.NIC):
                out += _straggler(track, ready, number, 1)
        elif ep is not None:
            if _recovered(track, ep):
                out.append(_cleared(job, ep, track.t, "recovered"))
            elif (
                ep.culprit is not None
                and ready is not None
                and ready.identity() == ep.culprit.identity()
                and ep.culprit.kind in (CulpritKind.GPU, CulpritKind.NIC)
                and ep.last_confirm is not None
                and track.t - ep.last_confirm >= RECONFIRM_S
            ):
                out += _straggler(track, ep.culprit, ep.number, ep.confirms + 1)
    return out


def _recovered(track: JobTrack, ep: Episode) -> bool:
    if track.culprit_now() is None and track.ready is None:
        if track.steps is not None and track.steps.finding is None and track.steps.evaluated >= 0:
            return True  # judged by its steps: CLEAR_STEPS quiet steps already passed (services/perf/steps.py)
        if ep.culprit is not None and ep.culprit.pattern == "nccl_hang":
            return True  # its collectives move again
    return track.healthy_since is not None and track.t - track.healthy_since >= CLEAR_S


def _peer_dead_fault(fault_id: str, node: NodeKey, peer: DeadPeer, now: float) -> GpuFaultDetected:
    gpus = ",".join(str(g) for g in peer.gpus) or "?"
    return GpuFaultDetected(
        fault_id=fault_id,
        cluster=node[0],
        node=node[1],
        kind=FaultKind.NCCL_PEER_DEAD,
        severity=Severity.CRITICAL,
        observed_at=peer.seen_at or now,
        detail=f"NCCL RAS PEER_DEAD: process {peer.pid} on {peer.host} managing GPU {gpus}",
    )


def _detected(track: JobTrack, c: Culprit, number: int) -> JobSlowdownDetected:
    if c.score is not None:  # a step-table verdict: its own numbers, not the samples' own-best score
        evidence: dict[str, float | str] = {"score": c.score}
        score = c.score
    else:
        evidence = {"score": round(track.score, 3), "best_rate": round(track.best, 1)}
        evidence["rate"] = round(track.rate or 0.0, 1)
        score = round(track.score, 3)
    evidence.update(dict(c.evidence))
    since = c.since if c.since is not None else track.slow_since
    return JobSlowdownDetected(
        job_id=track.job_id,
        episode=number,
        at=track.t,
        since=since if since is not None else track.t,
        culprit=c.kind,
        score=score,
        confidence=c.confidence,
        cluster=c.node[0] if c.node else None,
        node=c.node[1] if c.node else None,
        gpu_index=c.gpu,
        nic=c.nic,
        leaf=c.leaf,
        evidence=evidence,
        reason=c.reason,
        gpu_indices=list(c.all_gpus()),
        ranks=list(c.ranks),
        pattern=c.pattern,
    )


def _straggler(track: JobTrack, c: Culprit, episode: int, n: int) -> list[tuple[Event, str]]:
    """One `straggler` fault per GPU of the culprit (a slow 4-GPU worker: four), so the health
    policy's per-GPU escalation takes every GPU of the worker out, and no other."""
    assert c.node is not None
    gpus: tuple[int | None, ...] = c.all_gpus() if c.kind is CulpritKind.GPU and c.gpus else (c.gpu,)
    out: list[tuple[Event, str]] = []
    for g in gpus:
        fault_id = f"perf/{track.job_id}/{episode}/{n}" + (f"/{g}" if len(gpus) > 1 else "")
        fault = GpuFaultDetected(
            fault_id=fault_id,
            cluster=c.node[0],
            node=c.node[1],
            kind=FaultKind.STRAGGLER,
            severity=Severity.WARNING,
            observed_at=track.t,
            gpu_index=g,
            detail=f"{track.job_id} {c.kind.value}: {c.reason}",
        )
        out.append((fault, fault_id))
    return out


def _cleared(job: str, ep: Episode, at: float, reason: str) -> tuple[Event, str]:
    event = JobSlowdownCleared(job_id=job, episode=ep.number, at=at, since=ep.since, reason=reason)
    return event, stable_id("perf", "cleared", job, ep.number)


def rank_heat(state: PerfState, job: str) -> dict[str, object] | None:
    """Per-rank GPU activity over the last evaluations, and the culprit: the job view."""
    track = state.jobs.get(job)
    if track is None:
        return None
    ep = state.episodes.get(job)
    c = ep.culprit if ep is not None and ep.culprit is not None else track.culprit_now()
    return {
        "job": job,
        "ranks": [{"node": key[1], "gpu": g} for key, g in track.ranks()],
        "times": [t for t, _ in track.heat],
        "activity_pct": [list(row) for _, row in track.heat],
        "culprit": None
        if c is None
        else {"kind": c.kind.value, "node": c.node[1] if c.node else None, "gpu": c.gpu, "nic": c.nic, "leaf": c.leaf},
        "verdict": "slow" if ep is not None else track.verdict,
    }


def verdicts(state: PerfState) -> list[dict[str, object]]:
    """Every tracked job's verdict for `chamber perf` (healthy | slow | phase | warming), and each
    job moved while slow that waits to resume (`moved`); `moved` is that episode's outcome."""
    out: list[dict[str, object]] = []
    for job in sorted(set(state.jobs) | set(state.moved)):
        if job not in state.jobs:
            out.append(_waiting_row(job, state.moved[job]))
            continue
        tr, ep = state.jobs[job], state.episodes.get(job)
        c = ep.culprit if ep is not None and ep.culprit is not None else tr.culprit_now()
        out.append(
            {
                "job": job,
                "verdict": "slow" if ep is not None else tr.verdict,
                "score": round(tr.score, 3),
                "ranks": len(tr.ranks()),
                "culprit": c.kind.value if c else None,
                "node": c.node[1] if c and c.node else None,
                "gpu": c.gpu if c else None,
                "gpus": list(c.all_gpus()) if c else [],
                "culprit_ranks": list(c.ranks) if c else [],
                "pattern": c.pattern if c else "",
                "nic": c.nic if c else None,
                "leaf": c.leaf if c else None,
                "evidence": c.reason if c else "",
                "since": ep.since if ep is not None else tr.slow_since,
                "moved": state.moved[job].outcome() if job in state.moved else None,
            }
        )
    return out


def _waiting_row(job: str, moved: Moved) -> dict[str, object]:
    """A job moved while slow, not running yet: its episode stays in view with where it was moved off."""
    return {
        "job": job,
        "verdict": "moved",
        "score": None,
        "ranks": 0,
        "culprit": None,
        "node": None,
        "gpu": None,
        "gpus": [],
        "culprit_ranks": [],
        "pattern": "",
        "nic": None,
        "leaf": None,
        "evidence": "",
        "since": moved.at,
        "moved": moved.outcome(),
    }
