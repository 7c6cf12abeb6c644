"""Cost per serving workload, and per million tokens where the workload reports them. A serving
workload's replicas are jobs (JobSubmitted with `spec.serving`, services/scheduler/serving.py); the
cost billing accrues for them (its own CostAccrued, which names the workload, folded back) is summed
per workload and UTC month,
and so are the tokens its owner reports (ServingTokensReported, `chamber billing tokens`). Pure: folded
by the billing core, answered by `chamber.cmd.billing.serving`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events import CostAccrued, Event, JobSubmitted, ServingTokensReported
from services.billing.idle import month_of

Workload = tuple[str, str, str]  # cluster, namespace, <kind>/<name>


@dataclass
class ServingLedger:
    replica_of: dict[str, str] = field(default_factory=dict)  # live replica job -> <namespace>/<kind>/<name>
    team_of: dict[Workload, str] = field(default_factory=dict)
    cost: dict[tuple[Workload, str], tuple[float, float]] = field(default_factory=dict)  # (w, month) -> cost, GPU-s
    tokens: dict[tuple[Workload, str], int] = field(default_factory=dict)  # (w, month) -> tokens


def fold(ledger: ServingLedger, event: Event) -> None:
    """Each fact on its own (no lookup across streams): the same state whatever order JOBS and BILLING
    are merged in. A CostAccrued names its workload (billing's decide reads `replica_of`, which the job's
    JobSubmitted, earlier in JOBS than anything billed, has filled)."""
    match event:
        case JobSubmitted() if event.spec.serving is not None:
            spec = event.spec
            assert spec.serving is not None
            ledger.replica_of[event.job_id] = f"{spec.namespace or ''}/{spec.serving.workload}"
            ledger.team_of[(spec.cluster or "", spec.namespace or "", spec.serving.workload)] = spec.team
        case CostAccrued() if event.serving is not None:
            namespace, _, workload = event.serving.partition("/")
            key = ((event.cluster or "", namespace, workload), month_of(event.period_start))
            cost, seconds = ledger.cost.get(key, (0.0, 0.0))
            ledger.cost[key] = (cost + event.cost, seconds + event.gpu_seconds)
        case ServingTokensReported():
            key = ((event.cluster, event.namespace, event.workload), month_of(event.at))
            ledger.tokens[key] = ledger.tokens.get(key, 0) + event.tokens


def find(ledger: ServingLedger, namespace: str, workload: str, cluster: str | None) -> list[Workload]:
    """The workloads billing knows by that namespace and `<kind>/<name>` (in `cluster`, or any)."""
    return sorted(w for w in ledger.team_of if w[1:] == (namespace, workload) and cluster in (None, w[0]))


def by_workload(ledger: ServingLedger, month: str | None = None) -> list[dict[str, object]]:
    """Per workload (in `month`, "YYYY-MM", or ever): its team, cost, GPU-hours, tokens and cost per
    million tokens (None without tokens), most costly first."""
    sums: dict[Workload, list[float]] = {}
    for (w, m), (cost, seconds) in ledger.cost.items():
        if month is None or m == month:
            row = sums.setdefault(w, [0.0, 0.0, 0.0])
            row[0] += cost
            row[1] += seconds
    for (w, m), tokens in ledger.tokens.items():
        if month is None or m == month:
            sums.setdefault(w, [0.0, 0.0, 0.0])[2] += tokens
    rows: list[dict[str, object]] = []
    for (cluster, namespace, workload), (cost, seconds, count) in sums.items():
        rows.append(
            {
                "cluster": cluster,
                "namespace": namespace,
                "workload": workload,
                "team": ledger.team_of.get((cluster, namespace, workload), ""),
                "cost": round(cost, 6),
                "gpu_hours": round(seconds / 3600.0, 6),
                "tokens": int(count),
                "cost_per_million_tokens": round(cost / count * 1e6, 6) if count else None,
            }
        )
    rows.sort(key=lambda r: (-float(r["cost"]), str(r["cluster"]), str(r["namespace"]), str(r["workload"])))  # type: ignore[arg-type]
    return rows
