"""Billing per serving workload: its replicas' cost summed, and per million tokens where the workload
reports them (services/billing/serving.py, `chamber.cmd.billing.tokens` and `.serving`)."""

from __future__ import annotations

import msgspec
import pytest

from events import Event, JobCancelled, NodeDiscovered, PriceSet
from services.billing.core import BillingState, decide, evolve
from services.billing.service import ReportTokens, ServingRequest, answer_serving, snapshot_codec, validate_tokens
from services.runtime.commands import CommandRefused
from tests.warehouse_builders import a_serving_replica, an_inventory, completed, scheduled, submitted

T = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def run(events: list[Event], until: float) -> BillingState:
    """Fold the facts, then accrue every settled period, folding billing's own decisions back as the host does."""
    state = BillingState(period_s=600, settle_s=30)
    for i, e in enumerate(events):
        evolve(state, e, f"in-{i}")
    for now in range(int(T) + 600, int(until) + 1, 600):
        for e, event_id in decide(state, float(now) + 30):
            evolve(state, e, event_id)
    return state


def test_cost_per_serving_workload_and_per_million_tokens() -> None:
    inv = an_inventory("n1", gpus=8, model="H100-80GB", at=T)
    state = run(
        [
            PriceSet(gpu_model="H100-80GB", at=T - 10, price_per_gpu_hour=3.0),
            NodeDiscovered(cluster="c1", node="n1", at=T, gpus=inv.gpus),
            a_serving_replica("r0", 0, T),
            scheduled("r0", "vision", "n1", [0, 1], T),
            a_serving_replica("r1", 1, T),
            scheduled("r1", "vision", "n1", [2, 3], T),
            JobCancelled(job_id="r1", at=T + 1800, by="kubernetes"),  # scaled down after half an hour
            submitted("train", "vision", 4, T),  # training of the same team is not the workload's cost
            scheduled("train", "vision", "n1", [4, 5, 6, 7], T),
            completed("train", T + 3600),
            JobCancelled(job_id="r0", at=T + 3600, by="kubernetes"),  # scaled to zero
        ],
        until=T + 3 * 3600,
    )
    assert answer_serving(state, ServingRequest(), T)["workloads"] == [
        {
            "cluster": "c1",
            "namespace": "ml",
            "workload": "deployment/llm",
            "team": "vision",
            "cost": pytest.approx(9.0),  # 2 GPUs x 1 h + 2 GPUs x 0.5 h, at 3.0 a GPU-hour
            "gpu_hours": pytest.approx(3.0),
            "tokens": 0,
            "cost_per_million_tokens": None,
        }
    ]
    assert state.serving.replica_of == {}  # the replicas' costs are in: they are forgotten, the sums stay

    accepted = validate_tokens(state, ReportTokens(namespace="ml", workload="deployment/llm", tokens=3_000_000), T + 60)
    [append] = accepted.appends
    evolve(state, append.event, append.id)
    [row] = answer_serving(state, ServingRequest(month="2026-01"), T)["workloads"]
    assert (row["tokens"], row["cost_per_million_tokens"]) == (3_000_000, pytest.approx(3.0))
    assert answer_serving(state, ServingRequest(month="2025-12"), T)["workloads"] == []

    restored = snapshot_codec().decode(snapshot_codec().encode(state))
    assert answer_serving(restored, ServingRequest(), T) == answer_serving(state, ServingRequest(), T)


def test_tokens_for_a_workload_billing_does_not_know_are_refused_with_the_fix() -> None:
    state = run([a_serving_replica("r0", 0, T)], until=T)
    with pytest.raises(CommandRefused, match="no serving workload deployment/other in namespace ml"):
        validate_tokens(state, ReportTokens(namespace="ml", workload="deployment/other", tokens=1), T)
    other = msgspec.structs.replace(a_serving_replica("x0", 0, T), job_id="x0")
    evolve(state, msgspec.structs.replace(other, spec=msgspec.structs.replace(other.spec, cluster="c2")), "x")
    with pytest.raises(CommandRefused, match="is in clusters c1, c2"):
        validate_tokens(state, ReportTokens(namespace="ml", workload="deployment/llm", tokens=1), T)
    accepted = validate_tokens(
        state, ReportTokens(namespace="ml", workload="deployment/llm", tokens=1, cluster="c2"), T
    )
    assert accepted.result["cluster"] == "c2"


def test_the_cli_table_shows_cost_per_million_tokens_only_where_tokens_were_reported() -> None:
    from services.cli.billing import serving_text

    rows = [
        {"cluster": "c1", "namespace": "ml", "workload": "deployment/llm", "team": "vision", "cost": 9.0,
         "gpu_hours": 3.0, "tokens": 3_000_000, "cost_per_million_tokens": 3.0},
        {"cluster": "c1", "namespace": "ml", "workload": "statefulset/kv", "team": "vision", "cost": 1.5,
         "gpu_hours": 0.5, "tokens": 0, "cost_per_million_tokens": None},
    ]  # fmt: skip
    text = serving_text({"month": "2026-01", "currency": "USD", "workloads": rows})
    lines = text.splitlines()
    assert lines[0] == "serving workloads in 2026-01"
    assert lines[2].split() == ["c1/ml/deployment/llm", "vision", "3.00", "9.00", "3000000", "3.0000"]
    assert lines[3].split() == ["c1/ml/statefulset/kv", "vision", "0.50", "1.50", "-", "-"]
    assert serving_text({"workloads": []}) == "no serving workload has cost anything yet"
