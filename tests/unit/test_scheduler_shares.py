"""Fractional and MIG jobs in the live scheduling cycle: shares pack onto GPUs, modes never mix, MIG
instances land on legal free slices, gangs of shares are all or nothing, preempting a share frees room,
and quotas count GPU-equivalents."""

from __future__ import annotations

from typing import Any

import pytest

from events import GpuShare, JobSpec, Placement, PriorityClass, ShareMode
from events.commands import SubmitJob
from events.names import InvalidName
from services.kube.kinds import BatchJob
from services.scheduler.core import Admit, Preempt, schedule
from services.scheduler.core.door import cannot_run, submitted
from services.scheduler.core.explain import explain, queue_rows
from services.scheduler.core.mig import MIG_MODELS, occupancy
from services.scheduler.kubernetes import spec_of, through_the_door
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done

TS = GpuShare(gpu_milli=250)
MPS = GpuShare(gpu_milli=500, mode=ShareMode.MPS)


def mig(profile: str) -> GpuShare:
    return GpuShare(mode=ShareMode.MIG, mig_profile=profile)


def placed(d: Driver, job_id: str) -> list[Placement]:
    return d.state.jobs[job_id].placements


def gpus_of(d: Driver, job_id: str) -> set[tuple[str, int]]:
    return {(p.node, i) for p in placed(d, job_id) for i in p.gpu_indices}


def test_fractions_share_one_gpu_and_whole_gpus_stay_whole() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 2))
    for i in range(4):
        d.given(a_job(f"f{i}", gpus=1, share=TS, at=1 + i))
    d.given(a_job("whole", gpus=1, at=9))
    d.cycle()
    shared = set().union(*(gpus_of(d, f"f{i}") for i in range(4)))
    assert len(shared) == 1  # four quarters on one GPU
    assert gpus_of(d, "whole") and gpus_of(d, "whole").isdisjoint(shared)
    assert {p.share_milli for i in range(4) for p in placed(d, f"f{i}")} == {250}
    assert d.state.usage[("default", "vision")] == 2.0  # one whole GPU + four quarters
    # both GPUs are taken now: another quarter waits
    d.given(a_job("f4", gpus=1, share=TS, at=20))
    d.cycle(now=30)
    assert d.state_of("f4") == "pending"
    assert "250 milli-GPU (time-slicing)" in d.waiting["f4"]


def test_modes_never_share_a_gpu() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 2))
    d.given(a_job("ts", gpus=1, share=TS, at=1), a_job("mps", gpus=1, share=MPS, at=2))
    d.given(a_job("mps2", gpus=1, share=MPS, at=3), a_job("ts2", gpus=1, share=TS, at=4))
    d.cycle()
    assert gpus_of(d, "ts") == gpus_of(d, "ts2")
    assert gpus_of(d, "mps") == gpus_of(d, "mps2")
    assert gpus_of(d, "ts").isdisjoint(gpus_of(d, "mps"))
    # one GPU left half used by each mode: a third mode's job (MIG) cannot go on either
    d.given(a_job("more-mps", gpus=1, share=GpuShare(gpu_milli=600, mode=ShareMode.MPS), at=5))
    d.cycle(now=20)
    assert d.state_of("more-mps") == "pending"  # 500 + 600 > 1000, and the time-sliced GPU is another mode


def test_memory_is_checked_where_the_gpu_memory_is_known() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1, memory_mib=81920))
    d.given(a_job("a", gpus=1, share=GpuShare(gpu_milli=100, memory_mib=60000), at=1))
    d.given(a_job("b", gpus=1, share=GpuShare(gpu_milli=100, memory_mib=30000), at=2))
    d.cycle()
    assert d.state_of("a") == "running" and d.state_of("b") == "pending"


def test_mig_instances_take_legal_free_slices_and_pack_one_gpu() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 2, model="A100-80GB"))
    d.given(a_job("big", gpus=1, share=mig("3g.40gb"), at=1))
    d.given(a_job("small", gpus=1, replicas=4, share=mig("1g.10gb"), at=2))
    d.cycle()
    table = MIG_MODELS["A100-80GB"]
    per_gpu: dict[int, int] = {}
    for jid in ("big", "small"):
        for p in placed(d, jid):
            assert p.mig_profile and p.mig_start in table.profiles[p.mig_profile].starts
            mask = occupancy(table, p.mig_profile, p.mig_start)
            [g] = p.gpu_indices
            assert not per_gpu.get(g, 0) & mask, "instances overlap"
            per_gpu[g] = per_gpu.get(g, 0) | mask
            assert p.share_milli == table.share_milli(p.mig_profile)
    assert len(per_gpu) == 1  # 3g + 4 x 1g fit on one A100's 7 compute slices
    assert d.state.jobs["big"].gpus == pytest.approx(table.share_milli("3g.40gb") / 1000)
    text = explain(d.state, "small", {})
    assert text is not None and "1g.10gb at slice" in text["text"] and len(text["shares"]) == 4
    rows = {r["id"]: r for r in queue_rows(d.state, {}, now=20.0)}
    assert (rows["small"]["share"], rows["small"]["replicas"]) == ("1g.10gb MIG instance", 4)


def test_a_mig_profile_goes_only_where_the_model_has_it() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("l40", 1, model="L40S"), a_node("a30", 1, model="A30-24GB"))
    d.given(a_job("m", gpus=1, share=mig("1g.6gb"), at=1), a_job("n", gpus=1, share=mig("1g.10gb"), at=2))
    d.cycle()
    assert gpus_of(d, "m") == {("a30", 0)}
    assert d.state_of("n") == "pending"  # no A100/H100 here


def test_a_gang_of_fractions_is_all_or_nothing() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 2))
    d.given(a_job("half", gpus=1, share=GpuShare(gpu_milli=500), at=1))
    d.cycle()
    d.given(a_job("gang", gpus=1, replicas=4, share=GpuShare(gpu_milli=500), at=2))
    d.cycle(now=20)
    assert d.state_of("gang") == "pending"  # 3 halves of room for 4
    assert not any(d.state.node_by_id[0].shared[g].holders.get("gang") for g in d.state.node_by_id[0].shared)
    d.given(done("half", at=25))
    d.cycle(now=30)
    assert d.state_of("gang") == "running" and len(placed(d, "gang")) == 4
    assert len(gpus_of(d, "gang")) == 2


def test_a_cycle_leaves_the_shares_and_the_index_as_it_found_them() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 2, model="A100-80GB"))
    d.given(a_job("a", gpus=1, share=TS, at=1), a_job("m", gpus=1, share=mig("2g.20gb"), at=2))
    d.cycle()
    d.given(a_job("b", gpus=1, share=TS, at=3), a_job("low", gpus=1, replicas=3, share=mig("2g.20gb"), at=4))
    before = (d.state.capacity.digest(), repr(d.state.node_by_id[0].shared))
    cycle = schedule(d.state, 10.0)
    assert any(isinstance(x, Admit) for x in cycle.decisions)
    assert (d.state.capacity.digest(), repr(d.state.node_by_id[0].shared)) == before


def test_preempting_a_fractional_victim_frees_its_share() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1))
    d.given(a_job("low", gpus=1, share=GpuShare(gpu_milli=750), priority="low", at=1))
    d.cycle()
    d.given(a_job("high", gpus=1, share=GpuShare(gpu_milli=500), priority="high", at=2))
    cycle = d.cycle(now=20)
    assert [x.job_id for x in cycle.decisions if isinstance(x, Preempt)] == ["low"]
    assert d.state_of("high") == "running" and d.state_of("low") == "suspended"
    assert d.state.node_by_id[0].shared[0].milli == 500


def test_a_whole_gpu_job_preempts_every_share_on_the_gpu_it_needs() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1))
    d.given(a_job("q1", gpus=1, share=TS, priority="low", at=1), a_job("q2", gpus=1, share=TS, priority="low", at=2))
    d.cycle()
    d.given(a_job("whole", gpus=1, priority="high", at=3))
    cycle = d.cycle(now=20)
    assert sorted(x.job_id for x in cycle.decisions if isinstance(x, Preempt)) == ["q1", "q2"]
    assert d.state_of("whole") == "running" and not d.state.node_by_id[0].shared


def test_quota_counts_gpu_equivalents() -> None:
    d = Driver().given(a_quota("vision", 1, borrow=0), a_node("n1", 4, model="A100-80GB"))
    for i in range(4):
        d.given(a_job(f"s{i}", gpus=1, share=mig("1g.10gb"), at=1 + i))
    for i in range(6):
        d.given(a_job(f"q{i}", gpus=1, share=TS, at=10 + i))
    d.cycle(now=20)
    assert all(d.state_of(f"s{i}") == "running" for i in range(4))  # 4 x 1g cost 0.536 GPU, not 4
    running = [f"q{i}" for i in range(6) if d.state_of(f"q{i}") == "running"]
    assert running == ["q0"]  # 0.536 + 0.25 = 0.786; another quarter would pass the 1 GPU the team may hold
    assert d.state.usage[("default", "vision")] == pytest.approx(0.786)
    for i in range(4):
        d.given(done(f"s{i}", at=30))
    d.cycle(now=40)
    assert [f"q{i}" for i in range(6) if d.state_of(f"q{i}") == "running"] == ["q0", "q1", "q2", "q3"]
    assert d.state.usage[("default", "vision")] == 1.0


def test_completion_makes_the_gpu_whole_again() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1))
    d.given(a_job("f", gpus=1, share=TS, at=1))
    d.cycle()
    d.given(a_job("whole", gpus=1, at=2))
    d.cycle(now=20)
    assert d.state_of("whole") == "pending"
    d.given(done("f", at=25))
    d.cycle(now=30)
    assert d.state_of("whole") == "running" and not d.state.node_by_id[0].shared
    assert d.state.usage[("default", "vision")] == 1


# -- the submit path --------------------------------------------------------------------------------
def test_shares_are_judged_at_the_door_in_gpu_equivalents() -> None:
    d = Driver().given(a_quota("vision", 1, borrow=1), a_node("n1", 2))
    quarters = JobSpec(team="vision", gpus_per_replica=1, replicas=8, share=TS)
    assert cannot_run(d.state, quarters) == []  # 8 quarters are 2 GPUs, not 8
    halves = JobSpec(team="vision", gpus_per_replica=1, replicas=6, share=GpuShare(gpu_milli=500))
    [fleet, team] = cannot_run(d.state, halves)
    assert "asks for 3 GPUs and pool default has 2 installed" in fleet and "asks for 3" in team


def test_the_door_turns_submit_options_into_the_share() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1, model="A100-80GB"))
    asked = SubmitJob(team="vision", gpu_milli=300, gpu_memory_mib=8000, share_mode=ShareMode.MPS)
    event = submitted(d.state, asked, "j", 1)
    assert event.spec.share == GpuShare(gpu_milli=300, memory_mib=8000, mode=ShareMode.MPS)
    assert event.spec.gpus_per_replica == 1
    event = submitted(d.state, SubmitJob(team="vision", mig_profile="1g.10gb", replicas=2), "k", 1)
    assert event.spec.share == mig("1g.10gb") and event.spec.replicas == 2


@pytest.mark.parametrize(
    ("request_", "field", "words"),
    [
        ({"mig_profile": "1g.10gb", "gpu_milli": 100}, "mig_profile", "alone"),
        ({"mig_profile": "1g.10g"}, "mig_profile", "did you mean '1g.10gb'"),
        ({"gpu_memory_mib": 4000}, "gpu_milli", "--gpu-milli"),
        ({"gpu_milli": 100, "gpus": 2}, "gpus", "--replicas"),
    ],
)
def test_the_door_refuses_a_share_it_cannot_place(request_: dict[str, Any], field: str, words: str) -> None:
    d = Driver().given(a_quota("vision", 8))
    with pytest.raises(InvalidName) as err:
        submitted(d.state, SubmitJob(team="vision", **request_), "j", 1)
    assert err.value.field == field and words in str(err.value)


def test_a_kubernetes_fraction_and_a_mig_pod_become_shared_jobs() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1, model="A100-80GB", memory_mib=81920))

    def job(annotations: dict[str, str], limits: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": "j", "namespace": "ml", "labels": {"chamber.io/team": "vision"}},
            "spec": {
                "parallelism": 2,
                "template": {
                    "metadata": {"annotations": annotations},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
                },
            },
        }

    spec = spec_of(BatchJob(), job({"gpu-fraction": "0.25"}, {}), "c1")
    assert isinstance(spec, JobSpec) and spec.share == GpuShare(gpu_milli=250) and spec.replicas == 2
    spec = spec_of(BatchJob(), job({}, {"nvidia.com/mig-1g.10gb": "1"}), "c1")
    assert isinstance(spec, JobSpec) and spec.share == mig("1g.10gb")
    spec = spec_of(BatchJob(), job({"gpu-memory": "20480"}, {}), "c1")
    assert isinstance(spec, JobSpec)
    event = through_the_door(d.state, spec, "k8s-j", 1.0)
    assert not isinstance(event, str) and event.spec.share is not None
    assert event.spec.share.gpu_milli == 250 and event.spec.share.memory_mib == 20480  # 20 GiB of 80
    assert event.spec.priority == PriorityClass.NORMAL


def test_the_sharing_pages_submit_examples_reach_the_scheduler_as_shares() -> None:
    """Each `chamber submit` line of docs/sharing.md, through the CLI's parser and payload and the
    request decoder, becomes the share the page says."""
    import shlex
    from pathlib import Path

    from events.names import decode_request
    from services.cli import build_parser
    from services.cli.jobs import submit_payload

    page = (Path(__file__).resolve().parents[2] / "docs" / "sharing.md").read_text()
    lines = [line.split("#")[0] for line in page.splitlines() if line.startswith("chamber submit ")]
    assert len(lines) == 3
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1, model="H100-80GB"))
    shares = []
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        event = submitted(d.state, decode_request(submit_payload(args), SubmitJob), "j", 1)
        shares.append((event.spec.share, event.spec.replicas))
    assert shares == [
        (TS, 1),
        (GpuShare(gpu_milli=500, memory_mib=20480, mode=ShareMode.MPS), 4),
        (mig("1g.10gb"), 1),
    ]


def test_backfill_counts_a_shared_gpu_free_only_when_its_last_share_ends() -> None:
    # n1's two GPUs hold two halves each: one half of each ends at t=100, the other at t=300, so n1 is
    # whole again at 300 (not at 100, when two halves on different GPUs have ended)
    d = Driver().given(a_quota("vision", 16), a_node("n1", 2), a_node("n2", 2))
    for i, est in enumerate((100, 300, 100, 300)):
        d.given(a_job(f"h{i}", gpus=1, share=GpuShare(gpu_milli=500), estimate=est, at=i))
    d.given(a_job("hold", gpus=1, estimate=1000, at=5))
    d.cycle(now=0)
    assert {g for i in range(4) for g in gpus_of(d, f"h{i}")} == {("n1", 0), ("n1", 1)}
    assert gpus_of(d, "h0") == gpus_of(d, "h1") and gpus_of(d, "h2") == gpus_of(d, "h3")
    d.given(
        a_job("head", gpus=2, at=10),
        a_job("fits", gpus=1, estimate=200, at=11),  # ends at 210, before n1 is whole again
        a_job("delays", gpus=1, estimate=400, at=12),  # ends at 410
    )
    d.cycle(now=10)
    assert d.state_of("head") == "pending" and "reserved" in d.waiting["head"]
    assert d.state_of("fits") == "running"
    assert d.state_of("delays") == "pending" and "backfill: would delay head" in d.waiting["delays"]


def test_backfill_reserves_for_a_share_when_enough_room_frees_on_one_gpu() -> None:
    # two GPUs, each 700 (ending at 500) + 250 (ending at 100): at 100 the quarters' ends add up to
    # half a GPU, but no one GPU has 500 free until 500
    d = Driver().given(a_quota("vision", 16), a_node("n1", 2))
    for i, (milli, est) in enumerate(((700, 500), (700, 500), (250, 100), (250, 100))):
        d.given(a_job(f"h{i}", gpus=1, share=GpuShare(gpu_milli=milli), estimate=est, at=i))
    d.cycle(now=0)
    assert gpus_of(d, "h2") | gpus_of(d, "h3") == {("n1", 0), ("n1", 1)}
    d.given(
        a_job("head", gpus=1, share=GpuShare(gpu_milli=500), at=10),
        a_job("fits", gpus=1, share=GpuShare(gpu_milli=50), estimate=200, at=11),  # ends at 210
        a_job("leftover", gpus=1, share=GpuShare(gpu_milli=50), estimate=1000, at=12),
        a_job("delays", gpus=1, share=GpuShare(gpu_milli=50), estimate=1000, at=13),
    )
    d.cycle(now=10)
    assert d.state_of("head") == "pending" and "reserved for it from about" in d.waiting["head"]
    assert d.state_of("fits") == "running"
    # at 500 both GPUs are whole again (one is enough for the head): a share running past it may take
    # one of them (and so counts a whole GPU), the next may not
    assert d.state_of("leftover") == "running" and gpus_of(d, "leftover") != gpus_of(d, "fits")
    assert d.state_of("delays") == "pending" and "backfill: would delay head" in d.waiting["delays"]


def test_a_gang_of_shares_stays_on_its_node_then_in_its_rack() -> None:
    d = Driver().given(a_quota("vision", 32), a_node("y", 1, rack="b"), a_node("x", 2, model="A100", rack="a"))
    d.given(a_node("z", 2, rack="a"), a_node("w", 3, rack="b"))
    d.given(a_job("other", gpus=1, share=GpuShare(gpu_milli=600), model="A100", at=0))
    d.cycle(now=0)
    # the pair's first 400 goes on x's shared GPU; the second stays on x (not on y, which best fit
    # alone would pick: one free GPU, the lowest node)
    d.given(a_job("pair", gpus=1, replicas=2, share=GpuShare(gpu_milli=400), at=1))
    d.cycle(now=10)
    assert {n for n, _ in gpus_of(d, "pair")} == {"x"}
    # three 700s of H100: the first on y (best fit), the others in y's rack (w), not on z (rack a)
    d.given(a_job("wide", gpus=1, replicas=3, share=GpuShare(gpu_milli=700), model="H100", at=2))
    d.cycle(now=20)
    assert d.state_of("wide") == "running" and {n for n, _ in gpus_of(d, "wide")} == {"y", "w"}


def test_pod_cpu_and_memory_requests_and_submit_options_become_the_replicas_host_request() -> None:
    from services.cli import build_parser
    from services.cli.jobs import submit_payload
    from services.kube.resources import pod_host

    containers = [
        {
            "name": "main",
            "resources": {"requests": {"cpu": "3500m", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}},
        },
        {"name": "log", "resources": {"requests": {"cpu": "0.5"}}},
    ]
    sidecar = {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"memory": "512Mi"}}}
    init = {"name": "fetch", "resources": {"requests": {"cpu": "16"}}}
    spec = {"containers": containers, "initContainers": [sidecar, init]}
    assert pod_host(spec) == (16_000, 8192 + 512)  # the init container's 16 CPUs, run alone, is the peak
    assert pod_host({"containers": [{"name": "c"}]}) == (None, None)
    obj = {
        "metadata": {"name": "j", "namespace": "ml", "labels": {"chamber.io/team": "vision"}},
        "spec": {"parallelism": 2, "template": {"spec": {"containers": containers}}},
    }
    job = spec_of(BatchJob(), obj, "c1")
    assert isinstance(job, JobSpec) and (job.cpu_milli, job.memory_mib) == (4_000, 8192)
    d = Driver().given(a_quota("vision", 8))
    args = build_parser().parse_args(["submit", "--team", "vision", "--gpus", "1", "--cpu", "2.5", "--memory", "4096"])
    event = submitted(d.state, SubmitJob(**submit_payload(args)), "j", 1)
    assert (event.spec.cpu_milli, event.spec.memory_mib) == (2_500, 4096)
