"""Jobs that can never start on the fleet as installed are named at the door, with the numbers."""

from __future__ import annotations

import pytest

from events import GpuIsolated, JobSpec, NodeIsolated
from events.commands import SubmitJob
from events.names import InvalidName
from services.scheduler.core.door import cannot_run, submitted
from tests.scheduler_builders import Driver, a_node, a_quota


def spec(gpus: int, replicas: int = 1, model: str | None = None, team: str = "vision") -> JobSpec:
    return JobSpec(team=team, gpus_per_replica=gpus, replicas=replicas, gpu_model=model)


def test_what_can_never_run_is_said_with_numbers_and_what_can_is_not() -> None:
    d = Driver().given(a_node("n1", model="H100-80GB"), a_node("n2", model="H100-80GB"), a_quota("vision", 8, borrow=4))
    assert cannot_run(d.state, spec(8, 1)) == []
    [model] = cannot_run(d.state, spec(1, model="H100"))
    assert model == "no GPU in the fleet is a 'H100' (it has H100-80GB (16 GPUs)); did you mean 'H100-80GB'?"
    assert cannot_run(d.state, spec(1, model="h100-80gb")) == []  # case does not matter
    [fleet, team] = cannot_run(d.state, spec(8, 3))
    assert fleet == "the job asks for 24 GPUs and pool default has 16 installed"
    assert team == (
        "team vision may hold at most 12 GPUs in pool default (guarantee 8 + borrow limit 4) and the job asks for 24"
    )
    [node] = cannot_run(d.state, spec(12))
    assert "each replica asks for 12 GPUs on one node and the largest node of pool default has 8" in node


def test_isolations_do_not_make_a_job_impossible_and_an_empty_fleet_says_nothing() -> None:
    d = Driver().given(a_node("n1"), a_node("n2"))
    d.given(
        NodeIsolated(cluster="c1", node="n1", at=1, reason="x"),
        GpuIsolated(cluster="c1", node="n2", gpu_index=0, at=1, reason="y"),
    )
    assert cannot_run(d.state, spec(8, 2)) == []  # they come back
    assert cannot_run(Driver().state, spec(64, 64)) == []  # nodes may still be joining


def test_a_team_typo_gets_a_did_you_mean() -> None:
    d = Driver().given(a_node("n1"), a_quota("vision", 8))
    with pytest.raises(InvalidName, match="no team 'vison'; did you mean 'vision'"):
        submitted(d.state, SubmitJob(team="vison", gpus=1), "j", 1.0)
    with pytest.raises(InvalidName, match="has no quota"):
        submitted(d.state, SubmitJob(team="speech", gpus=1), "j", 1.0)


def test_a_pool_typo_gets_a_did_you_mean_and_the_pools_there_are() -> None:
    d = Driver().given(a_node("n1"), a_quota("vision", 8), a_quota("vision", 8, pool="train"))
    with pytest.raises(InvalidName, match=r"no pool 'trian' \(pools: default, train\); did you mean 'train'\?"):
        submitted(d.state, SubmitJob(team="vision", gpus=1, pool="trian"), "j", 1.0)
    assert submitted(d.state, SubmitJob(team="vision", gpus=1, pool="train"), "j", 1.0).spec.pool == "train"


def test_a_removed_pool_takes_its_empty_quotas_and_jobs_move_to_the_teams_other_pool() -> None:
    from events import PoolDefined, PoolRemoved

    d = Driver().given(a_node("n1"), PoolDefined(pool="spare", at=0, gpu_model="B200"))
    d.given(a_quota("vision", 0, pool="spare"), a_quota("vision", 8))
    assert d.state.team_pools["vision"] == ["default", "spare"]
    d.given(PoolRemoved(pool="spare", at=1))
    assert "spare" not in d.state.pools and d.state.team_pools["vision"] == ["default"]
    with pytest.raises(InvalidName, match="no pool 'spare'"):
        submitted(d.state, SubmitJob(team="vision", gpus=1, pool="spare"), "j", 2.0)
