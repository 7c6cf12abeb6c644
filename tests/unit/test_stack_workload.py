from services.stack.workload import TEAMS, arrivals, quota_requests


def test_quotas_add_up_to_the_fleet_and_every_team_may_borrow() -> None:
    quotas = quota_requests(128)
    assert [q["team"] for q in quotas] == [t for t, _ in TEAMS]
    assert sum(q["gpus"] for q in quotas) == 128
    assert all(q["borrow_limit"] == 128 for q in quotas)


def test_arrivals_are_seeded_and_offer_about_the_asked_load() -> None:
    first = [a for _, a in zip(range(2000), arrivals(3, 0.0, 128, load=1.0, warm_fill=0), strict=False)]
    again = [a for _, a in zip(range(2000), arrivals(3, 0.0, 128, load=1.0, warm_fill=0), strict=False)]
    assert first == again
    span = first[-1].at - first[0].at
    gpu_s = sum(
        (a.request.get("gpus") or a.request["gpus_per_replica"] * a.request["replicas"]) * a.request["sim_duration_s"]
        for a in first
    )
    assert 0.85 < gpu_s / (span * 128) < 1.15
    assert {a.request["priority"] for a in first} == {"low", "normal", "high"}
    assert all(a.request["preemptible"] is (a.request["priority"] != "high") for a in first)


def test_a_warm_start_asks_for_most_of_the_fleet_in_the_first_seconds() -> None:
    jobs = arrivals(3, 0.0, 128, warm_fill=0.7)
    early = [a for a in (next(jobs) for _ in range(200)) if a.at <= 60]
    asked = sum(a.request.get("gpus") or a.request["gpus_per_replica"] * a.request["replicas"] for a in early)
    assert asked >= 0.7 * 128
