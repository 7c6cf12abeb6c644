"""Prometheus `/metrics`: a collector that reads the read model at scrape time (no second copy of it).

Every name starts with `chamber_`. Gauges describe the fleet now; counters (`_total`) only grow as
events are folded (costs, faults, events seen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from services.gateway import core, views
from services.gateway.core import GatewayState, JobState
from services.gateway.fabric import FabricCollector

# (name, help) of the headline gauges; tests and the OpenAPI description list them from here.
FLEET_GAUGES: tuple[tuple[str, str], ...] = (
    ("chamber_gpus", "GPUs known to the fleet, in service or not (was chamber_gpus_total before 0.2)"),
    ("chamber_gpus_in_service", "GPUs that are healthy capacity: node in service, GPU not isolated"),
    ("chamber_gpus_allocated", "GPUs in service held by a job"),
    ("chamber_gpus_idle", "GPUs in service held by no job"),
    ("chamber_gpus_isolated", "GPUs out of service because they or their node are isolated"),
    ("chamber_gpus_allocated_idle", f"GPUs held by a job yet below {core.BUSY_THRESHOLD_PCT:g} % utilization"),
    ("chamber_gpus_busy", "sum of utilization (0..1) over allocated GPUs, in GPUs"),
    ("chamber_allocation_ratio", "allocated / in service"),
    ("chamber_usage_ratio", "busy / allocated"),
    ("chamber_efficiency_score", "busy / in service: the share of healthy capacity doing work"),
    ("chamber_idle_ratio", "idle / in service"),
    ("chamber_fleet_utilization_ratio", "mean utilization (0..1) over in-service GPUs that reported one"),
    ("chamber_queue_depth", "jobs waiting for a placement (pending, preempted or suspended)"),
    ("chamber_queue_gpus_requested", "GPUs the waiting jobs ask for"),
    ("chamber_nodes_isolated", "nodes isolated as a whole"),
    ("chamber_isolations_held", "isolations the isolation budget held back, waiting for an operator's confirmation"),
)


def fleet_values(state: GatewayState) -> dict[str, float]:
    eff = core.efficiency(state)
    q = views.queue(state)
    utils = [
        min(max(g.utilization_pct, 0.0), 100.0) / 100.0
        for n in state.nodes.values()
        for g in n.gpus.values()
        if core.gpu_in_service(n, g) and g.utilization_pct is not None
    ]
    return {
        "chamber_gpus": eff.total,
        "chamber_gpus_in_service": eff.capacity,
        "chamber_gpus_allocated": eff.allocated,
        "chamber_gpus_idle": eff.idle,
        "chamber_gpus_isolated": eff.isolated,
        "chamber_gpus_allocated_idle": eff.allocated_idle,
        "chamber_gpus_busy": eff.busy,
        "chamber_allocation_ratio": eff.allocation_ratio,
        "chamber_usage_ratio": eff.usage_ratio,
        "chamber_efficiency_score": eff.score,
        "chamber_idle_ratio": eff.idle_ratio,
        "chamber_fleet_utilization_ratio": sum(utils) / len(utils) if utils else 0.0,
        "chamber_queue_depth": q.depth,
        "chamber_queue_gpus_requested": q.gpus_requested,
        "chamber_nodes_isolated": sum(n.isolated is not None for n in state.nodes.values()),
        "chamber_isolations_held": len(state.held),
    }


class ReadModelCollector(Collector):
    def __init__(self, state: Callable[[], GatewayState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        values = fleet_values(state)
        for name, help_text in FLEET_GAUGES:
            yield GaugeMetricFamily(name, help_text, value=values[name])

        nodes = GaugeMetricFamily("chamber_nodes", "nodes by status", labels=["status"])
        by_status: dict[str, int] = {}
        for node in state.nodes.values():
            by_status[node.status] = by_status.get(node.status, 0) + 1
        for status, count in sorted(by_status.items()):
            nodes.add_metric([status], count)
        yield nodes

        node_util = GaugeMetricFamily(
            "chamber_node_utilization_ratio", "mean GPU utilization (0..1) of a node", labels=["cluster", "node"]
        )
        for node in sorted(state.nodes.values(), key=lambda n: n.key):
            utils = [g.utilization_pct for g in node.gpus.values() if g.utilization_pct is not None]
            if utils:
                node_util.add_metric([node.cluster, node.name], sum(utils) / len(utils) / 100.0)
        yield node_util

        jobs = GaugeMetricFamily("chamber_jobs", "jobs known to the gateway by state", labels=["state"])
        counts = dict.fromkeys((s.value for s in JobState), 0)
        for job in state.jobs.values():
            counts[job.state.value] += 1
        for job_state, count in counts.items():
            jobs.add_metric([job_state], count)
        yield jobs

        teams = views.teams(state).teams
        used = GaugeMetricFamily("chamber_team_gpus_used", "GPUs a team's jobs hold", labels=["team"])
        guaranteed = GaugeMetricFamily("chamber_team_gpus_guaranteed", "a team's guaranteed GPUs", labels=["team"])
        borrowed = GaugeMetricFamily(
            "chamber_team_gpus_borrowed", "GPUs a team uses beyond its guarantee", labels=["team"]
        )
        pending = GaugeMetricFamily("chamber_team_jobs_pending", "a team's jobs waiting in the queue", labels=["team"])
        rate = GaugeMetricFamily("chamber_team_cost_rate_per_hour", "cost per hour of a team's GPUs", labels=["team"])
        cost = CounterMetricFamily("chamber_team_cost", "cost accrued by a team", labels=["team", "currency"])
        for t in teams:
            used.add_metric([t.team], t.used_gpus)
            guaranteed.add_metric([t.team], t.guaranteed_gpus)
            borrowed.add_metric([t.team], t.borrowed_gpus)
            pending.add_metric([t.team], t.pending_jobs)
            rate.add_metric([t.team], t.cost_rate_per_hour)
            cost.add_metric([t.team, t.currency], t.cost)
        yield from (used, guaranteed, borrowed, pending, rate, cost)

        idle_cost = CounterMetricFamily("chamber_idle_cost", "cost of healthy GPUs no job held", labels=["currency"])
        idle_cost.add_metric([state.currency], state.idle_cost)
        yield idle_cost
        yield CounterMetricFamily("chamber_faults", "GPU faults detected", value=state.faults_total)
        yield CounterMetricFamily(
            "chamber_gateway_events", "events folded into the read model", value=state.events_seen
        )


class ReplayingCollector(Collector):
    """`chamber_replaying{service="gateway"}`: 1 while the read model folds the log (the numbers
    beside it are then a half-built fleet), 0 once caught up."""

    def __init__(self, replaying: Callable[[], str | None]) -> None:
        self.replaying = replaying

    def collect(self) -> Iterator[Metric]:
        from services.runtime.health import REPLAYING_GAUGE

        gauge = GaugeMetricFamily(*REPLAYING_GAUGE, labels=["service"])
        gauge.add_metric(["gateway"], 1.0 if self.replaying() else 0.0)
        yield gauge


def registry_for(
    state: Callable[[], GatewayState], *, replaying: Callable[[], str | None] = lambda: None
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadModelCollector(state))
    registry.register(ReplayingCollector(replaying))
    registry.register(FabricCollector(lambda: state().fabric))
    return registry
