"""MIG requests through the packer's one scorer: (node, GPU, start slice), beside whole and fractional."""

from __future__ import annotations

import pytest

from services.scheduler.core.mig import MIG_MODELS, MigError, free_starts
from services.scheduler.core.sharing import Mix, NodeSpec, Packer, PackError, PodRequest, mig_request

H100 = "H100-80GB"


def nodes(mig: int = 1, plain: int = 1, gpus: int = 2) -> list[NodeSpec]:
    out = [NodeSpec(f"mig{i}", 64_000, 512_000, gpus, H100, mig=True) for i in range(mig)]
    return out + [NodeSpec(f"plain{i}", 64_000, 512_000, gpus, H100) for i in range(plain)]


def mig(profile: str) -> PodRequest:
    return mig_request(profile, H100, cpu_milli=1000, memory_mib=1024)


def test_mig_requests_go_to_mig_gpus_and_others_do_not() -> None:
    packer = Packer(nodes(), mix=Mix.of([mig("1g.10gb"), PodRequest(1000, 1024, 1, 1000)]))
    spot = packer.place_at(mig("1g.10gb"))
    assert spot is not None and spot.node == "mig0" and spot.mig_start is not None
    whole = packer.place_at(PodRequest(1000, 1024, 1, 1000))
    assert whole is not None and whole.node == "plain0" and whole.mig_start is None
    share = packer.place_at(PodRequest(1000, 1024, 1, 300))
    assert share is not None and share.node == "plain0"


def test_a_small_instance_keeps_the_4g_placement_free_when_4g_requests_are_expected() -> None:
    packer = Packer(nodes(plain=0, gpus=1), mix=Mix.of([mig("1g.10gb"), mig("4g.40gb")]))
    spot = packer.place_at(mig("1g.10gb"))
    assert spot is not None and spot.mig_start in (4, 5, 6), "slices 0-3 are the only place for a 4g"
    assert packer.place_at(mig("4g.40gb")) == type(spot)("mig0", [0], 0)


def test_instances_fill_one_gpu_before_opening_another() -> None:
    packer = Packer(nodes(plain=0, gpus=2), mix=Mix.of([mig("1g.10gb"), mig("3g.40gb")]))
    spots = [packer.place_at(mig("1g.10gb")) for _ in range(3)]
    assert {s.gpus[0] for s in spots if s} == {0}


def test_a_gpu_takes_exactly_what_its_placements_allow() -> None:
    packer = Packer(nodes(plain=0, gpus=1))
    placed = [packer.place_at(mig("1g.10gb")) for _ in range(8)]
    assert sum(s is not None for s in placed) == 7, "seven 1g instances, the eighth memory slice stays free"
    assert packer.allocated_milli() == 7 * MIG_MODELS[H100].share_milli("1g.10gb")
    assert packer.place(mig("1g.20gb")) is None


def test_mixed_profiles_respect_placements_and_never_overlap() -> None:
    table = MIG_MODELS[H100]
    packer = Packer(nodes(plain=0, gpus=1), mix=Mix.of([mig("3g.40gb"), mig("2g.20gb"), mig("1g.10gb")]))
    layout: list[tuple[str, int]] = []
    for profile in ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"):
        spot = packer.place_at(mig(profile))
        if spot is None:
            assert not free_starts(table, layout, profile)
            continue
        assert spot.mig_start in free_starts(table, layout, profile)
        layout.append((profile, spot.mig_start))
    assert len(layout) == 4, "3g + 2g + 1g + 1g fill seven compute slices; the second 3g has no room"


def test_bad_mig_inputs_are_refused() -> None:
    with pytest.raises(PackError, match="no MIG table"):
        Packer([NodeSpec("n", 1000, 1000, 1, "T4", mig=True)])
    with pytest.raises(MigError):
        mig_request("5g.50gb", H100)
    assert Packer(nodes(mig=0)).place(mig("1g.10gb")) is None


def test_media_engine_profiles_are_one_per_gpu() -> None:
    packer = Packer(nodes(plain=0, gpus=1), mix=Mix.of([mig("1g.10gb+me")]))
    assert packer.place_at(mig("1g.10gb+me")) is not None
    assert packer.place_at(mig("1g.10gb+me")) is None, "the GPU has one set of media engines"
    assert packer.place_at(mig("1g.10gb")) is not None
