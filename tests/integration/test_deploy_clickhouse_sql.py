"""Issue 16, finding 1 on a ClickHouse server: analytics SQL runs as a user that may only SELECT from
the `chamber` database, within limits it cannot raise (the chart's rendered objects, real helm)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.deploy_tools import helm_binary
from tests.integration.test_deploy_chart import CHART, named, render

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def test_the_sql_user_may_only_select_from_chamber_within_fixed_limits() -> None:
    root = ET.parse(CHART / "files" / "clickhouse-sql-user.xml").getroot()
    user = root.find("users/chamber_sql")
    assert user is not None
    assert [q.text for q in user.iterfind("grants/query")] == ["GRANT SELECT ON chamber.*"]
    assert user.find("password").get("from_env") == "CLICKHOUSE_SQL_PASSWORD"  # type: ignore[union-attr]
    profile = root.find(f"profiles/{user.findtext('profile')}")
    assert profile is not None
    assert profile.findtext("readonly") in ("1", "2")
    limits = {name: int(profile.findtext(name) or 0) for name in ("max_execution_time", "max_memory_usage")}
    assert all(limits.values()) and profile.findtext("result_overflow_mode") == "break"
    for name, value in limits.items():  # a query's SETTINGS cannot raise them
        assert profile.findtext(f"constraints/{name}/max") == str(value)


def test_the_chart_creates_the_user_and_the_recorder_runs_sql_as_it(helm: Path) -> None:
    docs = render(helm, [])
    config = named(docs, "ConfigMap", "chamber-clickhouse")["data"]
    assert "GRANT SELECT ON chamber.*" in config["chamber-sql-user.xml"]
    server = named(docs, "StatefulSet", "chamber-clickhouse")["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert mounts["/etc/clickhouse-server/users.d/chamber-sql-user.xml"]["subPath"] == "chamber-sql-user.xml"
    password = {e["name"]: e for e in server["env"]}["CLICKHOUSE_SQL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password["key"] in named(docs, "Secret", password["name"])["data"]
    recorder = named(docs, "Deployment", "chamber-recorder")["spec"]["template"]["spec"]["containers"][0]
    env = [e["name"] for e in recorder["env"]]
    url = {e["name"]: e for e in recorder["env"]}["CHAMBER_CLICKHOUSE_SQL_URL"]["value"]
    assert url == "http://chamber_sql:$(CHAMBER_CLICKHOUSE_SQL_PASSWORD)@chamber-clickhouse.chamber.svc:8123"
    assert env.index("CHAMBER_CLICKHOUSE_SQL_PASSWORD") < env.index("CHAMBER_CLICKHOUSE_SQL_URL")


def test_an_external_server_gets_the_restricted_url_when_given(helm: Path) -> None:
    docs = render(
        helm,
        [],
        "clickhouse.deploy=false",
        "clickhouse.url=http://ch.example:8123",
        "clickhouse.sqlUrl=http://chamber_sql:$(CHAMBER_CLICKHOUSE_SQL_PASSWORD)@ch.example:8123",
        "clickhouse.sqlExistingSecret=ch-sql",
    )
    recorder = named(docs, "Deployment", "chamber-recorder")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in recorder["env"]}
    assert env["CHAMBER_CLICKHOUSE_SQL_URL"]["value"].startswith("http://chamber_sql:")
    assert env["CHAMBER_CLICKHOUSE_SQL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ch-sql", "key": "password"}
