"""Topology-aware gangs: no single leaf has room -> the fewest leaf switches that do."""

from __future__ import annotations

from events import JobSpec, JobSubmitted
from services.scheduler.core.topology import fewest_domains
from tests.scheduler_builders import Driver, a_node


def test_fewest_domains_takes_the_largest_first_and_refuses_what_cannot_fit() -> None:
    groups = {"a": (16, {1, 2}), "b": (24, {3, 4, 5}), "c": (8, {6})}
    assert fewest_domains(groups, 32) == {1, 2, 3, 4, 5}
    assert fewest_domains(groups, 24) == {3, 4, 5}
    assert fewest_domains(groups, 49) is None


def test_a_gang_too_big_for_one_leaf_spans_the_fewest_leaves() -> None:
    d = Driver().given(
        a_node("c1", leaf="leaf-c"),
        a_node("a1", leaf="leaf-a"), a_node("a2", leaf="leaf-a"),
        a_node("b1", leaf="leaf-b"), a_node("b2", leaf="leaf-b"), a_node("b3", leaf="leaf-b"),
    )  # fmt: skip
    spec = JobSpec(team="vision", gpus_per_replica=8, replicas=4, topology_key="leaf")
    d.given(JobSubmitted(job_id="gang", at=1, spec=spec))
    d.cycle()
    placed = set(d.where("gang"))
    assert len(placed) == 4 and "c1" not in placed  # leaves a and b (two switches), never c
