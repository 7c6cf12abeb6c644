"""The shared-GPU packer: whole GPUs, shares of one GPU, node CPU and memory, model allow-lists."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.core.sharing import (
    MAX_PODS,
    MILLI,
    Mix,
    NodeSpec,
    Packer,
    PackError,
    PodRequest,
    _MixArrays,
    fragment,
    mig_request,
)


def a_node(name: str = "n0", gpus: int = 8, cpu: int = 96_000, mem: int = 512_000, model: str = "G2") -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, gpus=gpus, model=model)


def a_pod(gpus: int = 1, milli: int = MILLI, cpu: int = 1000, mem: int = 1024, models: str = "") -> PodRequest:
    return PodRequest(cpu, mem, gpus, milli if gpus else 0, frozenset(m for m in models.split("|") if m))


@pytest.mark.parametrize("policy", ["chamber", "fgd", "bestfit"])
def test_shares_of_one_gpu_stack_on_one_gpu_before_breaking_another(policy: str) -> None:
    packer = Packer([a_node(gpus=2)], policy=policy, mix=Mix.of([a_pod(milli=500), a_pod()]))
    first = packer.place(a_pod(milli=500))
    second = packer.place(a_pod(milli=500))
    assert first is not None and second is not None
    assert first[1] == second[1], "the second half goes on the GPU the first half opened"
    assert packer.place(a_pod()) == ("n0", [1]), "a whole GPU is still free for a whole-GPU pod"


def test_a_whole_gpu_pod_needs_fully_free_gpus() -> None:
    packer = Packer([a_node(gpus=2)], mix=Mix.of([a_pod(milli=300)]))
    packer.place(a_pod(milli=300))
    assert packer.place(a_pod(gpus=2)) is None
    assert packer.place(a_pod(gpus=1)) is not None


def test_cpu_memory_and_the_pod_limit_are_hard_limits() -> None:
    packer = Packer([a_node(gpus=8, cpu=4000, mem=8192)])
    assert packer.place(a_pod(cpu=5000)) is None
    assert packer.place(a_pod(mem=9000)) is None
    assert packer.place(a_pod(gpus=0, cpu=4000, mem=8192)) == ("n0", [])
    assert packer.place(a_pod(gpus=0, cpu=1, mem=1)) is None, "the node's CPU is spent"
    many = Packer([a_node(gpus=0, cpu=10**9, mem=10**9)])
    placed = [many.place(a_pod(gpus=0, cpu=1, mem=1)) for _ in range(MAX_PODS + 1)]
    assert placed[-1] is None and all(p is not None for p in placed[:-1])


def test_a_model_allow_list_is_respected_and_scarce_models_are_kept_for_those_that_need_them() -> None:
    nodes = [a_node("t4", gpus=1, model="T4"), a_node("g2", gpus=1, model="G2")]
    mix = Mix.of([a_pod(models="T4"), a_pod(models="T4"), a_pod()])
    packer = Packer(nodes, mix=mix)
    assert packer.place(a_pod()) == ("g2", [0]), "an unconstrained pod leaves the T4 to the T4-only pods"
    assert packer.place(a_pod(models="T4")) == ("t4", [0])
    assert packer.place(a_pod(models="V100")) is None


def test_model_tightness_follows_the_free_capacity_and_steers_pods_with_a_choice() -> None:
    nodes = [a_node("t4", gpus=4, model="T4"), a_node("g2", gpus=4, model="G2")]
    # A third of the expected GPU demand can only run on T4s, which hold half the fleet.
    packer = Packer(nodes, mix=Mix.of([a_pod(models="T4"), a_pod(), a_pod()]))
    assert packer.tightness("T4") == pytest.approx(1 / 3 * 8 / 4)
    assert packer.tightness("G2") == 0.0, "no request is tied to G2"
    assert packer.place(a_pod(models="T4")) == ("t4", [0])
    assert packer.place(a_pod(models="T4")) == ("t4", [1])
    assert packer.tightness("T4") == pytest.approx(1 / 3 * 6 / 2), "half the T4s are gone, 6 of 8 GPUs free"
    # As many requests tied to T4 as to V100, but three times the V100s: a pod that may use either goes
    # to a V100 (the fragmentation and best fit alone cannot tell the two apart: the T4, first, wins).
    fleet = [a_node("t4", gpus=2, model="T4")] + [a_node(f"v100-{i}", gpus=2, model="V100") for i in range(3)]
    mix = Mix.of([a_pod(models="T4"), a_pod(models="V100"), a_pod()])
    assert Packer(fleet, mix=mix).place(a_pod(models="T4|V100")) == ("v100-0", [0])
    assert Packer(fleet, mix=mix, policy="fgd").place(a_pod(models="T4|V100")) == ("t4", [0])


def test_cpu_heavy_pods_go_where_cpu_is_plentiful_and_cpu_light_ones_where_it_is_not() -> None:
    # Same GPUs, same fill: only the CPU left per GPU left tells the nodes apart (ties go to "poor").
    nodes = [a_node("poor", gpus=4, cpu=16_000), a_node("rich", gpus=4, cpu=128_000)]
    heavy, light = a_pod(milli=500, cpu=8000), a_pod(milli=500, cpu=1000)
    mix = Mix.of([heavy, light])
    assert mix.cpu_per_milli == pytest.approx(9.0), "9,000 milli-CPU over 1,000 milli-GPU asked"
    packer = Packer(nodes, mix=mix)
    assert packer.place(heavy) == ("rich", [0]), "on the CPU-poor node it would strand GPU capacity"
    assert packer.place(light) == ("poor", [0]), "the CPU-light pod takes the node whose CPU is short"


def test_pods_without_gpus_count_in_the_cpu_ratio_only_when_cpu_is_the_scarcer_resource() -> None:
    nodes = [a_node("n0", gpus=4, cpu=16_000)]  # 4 milli-CPU per milli-GPU
    share = a_pod(milli=500, cpu=1000)  # 2 milli-CPU per milli-GPU
    assert Packer(nodes, mix=Mix.of([share, a_pod(gpus=0, cpu=500)])).cpu_ratio == pytest.approx(2.0)
    scarce = Mix.of([share, a_pod(gpus=0, cpu=8000)])  # 9,000 milli-CPU over 500 milli-GPU: 18 > 4
    assert Packer(nodes, mix=scarce).cpu_ratio == pytest.approx(18.0)


def test_rejected_pods_change_nothing_and_runs_are_deterministic() -> None:
    rng = random.Random(7)
    nodes = [a_node(f"n{i}", gpus=rng.choice([1, 2, 4, 8]), cpu=rng.choice([8000, 32000])) for i in range(30)]
    pods = [
        a_pod(gpus=rng.choice([0, 1, 1, 1, 2, 8]), milli=rng.choice([100, 250, 460, 1000]), cpu=rng.choice([500, 4000]))
        for _ in range(400)
    ]
    pods = [p if p.num_gpu <= 1 else a_pod(gpus=p.num_gpu, cpu=p.cpu_milli) for p in pods]

    def run() -> tuple[list[object], int]:
        packer = Packer(nodes, mix=Mix.of(pods))
        return [packer.place(p) for p in pods], packer.allocated_milli()

    first, allocated = run()
    assert (first, allocated) == run()
    assert allocated == sum(p.gpu_milli_total for p, spot in zip(pods, first, strict=True) if spot is not None)
    assert any(spot is None for spot in first), "the inventory is over-asked, so some pods are refused"


@pytest.mark.parametrize("policy", ["chamber", "fgd"])
def test_kept_scores_place_as_scoring_every_group_for_every_pod(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A low pod limit, so groups whose first node is one pod short of it come up (nothing is kept there).
    monkeypatch.setattr("services.scheduler.core.sharing.MAX_PODS", 6)
    rng = random.Random(11)
    nodes = [
        a_node(f"n{i}", gpus=rng.choice([2, 4, 8]), cpu=rng.choice([8000, 32000]), model=rng.choice(["G1", "G2"]))
        for i in range(24)
    ]
    pods = [
        a_pod(
            gpus=rng.choice([0, 1, 1, 1, 2]),
            milli=rng.choice([100, 250, 500, 1000]),
            cpu=rng.choice([500, 4000]),
            models=rng.choice(["", "", "G1", "G2"]),
        )
        for _ in range(200)
    ]
    pods = [p if p.num_gpu <= 1 else a_pod(gpus=p.num_gpu, cpu=p.cpu_milli) for p in pods]
    # Pods that take nothing but a pod slot: nodes of one state then hold different numbers of pods.
    pods = [a_pod(gpus=0, cpu=0, mem=0) if i % 3 == 0 else p for i, p in enumerate(pods)]

    def run(keep: bool) -> list[tuple[str, list[int]] | None]:
        packer = Packer(nodes, policy=policy, mix=Mix.of(pods[:50]))
        packer._cached = keep  # False: every group is scored for every pod, as without kept scores
        out = [packer.place(p) for p in pods[:100]]
        packer.set_mix(Mix.of(pods[100:]))  # what was kept was scored for the old mix
        return out + [packer.place(p) for p in pods[100:]]

    kept, every = run(True), run(False)
    assert kept == every
    assert sum(spot is None for spot in kept) > 10, "the inventory is over-asked, so some pods are refused"


def test_an_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(PackError, match="bestfit, chamber, fgd"):
        Packer([a_node()], policy="nope")


states = st.tuples(
    st.sampled_from(["T4", "G2"]),
    st.integers(0, 96_000),
    st.integers(0, 300_000),
    st.booleans(),
    st.lists(st.sampled_from([0, 50, 270, 460, 500, 999, 1000]), min_size=1, max_size=8).map(
        lambda g: tuple(sorted(g))
    ),
    st.just(()),  # not a MIG node
)


@settings(max_examples=200, deadline=None)
@given(state=states, with_memory=st.booleans())
def test_the_vectorised_fragmentation_is_fgds_definition(state: tuple, with_memory: bool) -> None:  # type: ignore[type-arg]
    mix = Mix.of(
        [a_pod(milli=460, cpu=4000), a_pod(cpu=12000, mem=65536), a_pod(gpus=8, cpu=64000), a_pod(models="T4")] * 2
        + [a_pod(milli=270, mem=200_000), mig_request("1g.10gb", "H100-80GB")]
    )
    columns = _MixArrays(mix, ["T4", "G2"])
    assert columns.fragment(state, with_memory) == pytest.approx(fragment(state, mix, with_memory))


near_asks = st.tuples(
    st.sampled_from(["T4", "G2"]),
    st.sampled_from([0, 999, 1000, 3999, 4000, 4001, 11_999, 12_000, 63_999, 64_000, 96_000]),
    st.sampled_from([0, 1023, 1024, 65_535, 65_536, 199_999, 200_000, 300_000]),
    st.just(False),
    st.lists(st.sampled_from([0, 270, 460, 1000]), min_size=1, max_size=8).map(lambda g: tuple(sorted(g))),
    st.just(()),
)


@settings(max_examples=100, deadline=None)
@given(seq=st.lists(st.one_of(states, near_asks), min_size=2, max_size=40), with_memory=st.booleans())
def test_fragmentation_kept_by_rank_of_cpu_and_memory_is_the_definition_for_every_state_in_turn(
    seq: list[tuple],
    with_memory: bool,  # type: ignore[type-arg]
) -> None:
    # One set of columns for the whole sequence, so what was kept for one state answers for the next
    # states with CPU and memory on the same side of every shape's ask (values at and beside the asks).
    mix = Mix.of([a_pod(milli=460, cpu=4000, mem=1024), a_pod(cpu=12000, mem=65536), a_pod(gpus=2, cpu=64000)])
    mix = Mix.of([*(s for s, _ in mix.shapes), a_pod(milli=270, cpu=1000, mem=200_000, models="T4")])
    columns = _MixArrays(mix, ["T4", "G2"])
    for state in seq:
        assert columns.fragment(state, with_memory) == pytest.approx(fragment(state, mix, with_memory))
