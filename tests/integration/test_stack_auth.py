"""The bus of `chamber up` (issue 16, finding 2): a private data directory, secrets created 0600,
per-role NATS users from `chamber nats-config`, no anonymous clients, each process in its role."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from services.cli import main
from services.cli.up import api_token
from services.gateway.service import token_from_file
from services.runtime import connect, ensure_streams
from services.runtime.credentials import CredentialsError, login
from services.runtime.nats_server import NatsServerProcess
from services.stack.credentials import create_secret, nats_auth, password_file, private_dir

pytestmark = pytest.mark.integration
SERVICES = ["billing", "discovery", "gateway", "health", "quota", "recorder", "scheduler"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # no credentials from the developer's own `.chamber` or environment
    monkeypatch.chdir(tmp_path)
    for name in ("CHAMBER_NATS_USER", "CHAMBER_NATS_PASSWORD_FILE", "CHAMBER_DATA_DIR", "CHAMBER_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return private_dir(tmp_path / "data")


@pytest.fixture
def bus(data_dir: Path) -> Iterator[NatsServerProcess]:
    conf = nats_auth(data_dir, "local", SERVICES)
    server = NatsServerProcess(data_dir / "nats", log_file=data_dir / "nats.log", extra_args=["-c", str(conf)])
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_the_data_dir_and_every_secret_in_it_are_private(data_dir: Path) -> None:
    old = os.umask(0)  # the modes must not depend on the user's umask
    try:
        conf = nats_auth(data_dir, "local", SERVICES)
        token = api_token(data_dir)
    finally:
        os.umask(old)
    assert mode(data_dir) == 0o700 and mode(data_dir / "nats-users") == 0o700
    assert mode(conf) == 0o600 and mode(data_dir / "api-token") == 0o600
    users = sorted(p.name for p in (data_dir / "nats-users").iterdir())
    assert {"admin", "reader", "simulator", "agent", "workload", *(f"svc-{s}" for s in SERVICES)} == set(users)
    assert all(mode(data_dir / "nats-users" / u) == 0o600 for u in users)
    # kept across restarts: a second start reads the same secrets
    passwords = {u: (data_dir / "nats-users" / u).read_text() for u in users}
    nats_auth(data_dir, "local", SERVICES)
    assert passwords == {u: (data_dir / "nats-users" / u).read_text() for u in users}
    assert api_token(data_dir) == token and len(token) >= 24
    assert not [p for p in data_dir.rglob("*.tmp")]  # no half-written file left behind


def test_a_wider_data_dir_is_narrowed_and_an_existing_secret_is_not_replaced(tmp_path: Path) -> None:
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    assert mode(private_dir(wide)) == 0o700
    assert create_secret(wide / "s", "first") == "first"
    assert create_secret(wide / "s", "second") == "first"
    (wide / "s").chmod(0o644)  # an api-token an older `chamber up` wrote, then chmod-ed
    assert create_secret(wide / "s") == "first" and mode(wide / "s") == 0o600


async def test_anonymous_clients_are_refused_at_once_with_a_clear_message(
    bus: NatsServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CredentialsError, match="refused an anonymous client"):
        await asyncio.wait_for(connect(bus.url, name="anonymous", attempts=1), 10)
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await asyncio.wait_for(nats.connect(bus.url, allow_reconnect=False), 10)


def test_the_cli_says_how_to_log_in_instead_of_hanging(
    bus: NatsServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fleet", "--nats", bus.url]) == 2
    err = capsys.readouterr().err
    assert "refused an anonymous client" in err and "CHAMBER_DATA_DIR" in err and "Traceback" not in err
    assert main(["sql", "SELECT 1", "--nats", bus.url]) == 2
    err = capsys.readouterr().err
    assert "refused the login" in err and "CHAMBER_DATA_DIR" in err


async def test_each_process_logs_in_as_its_role_from_its_file_and_stays_inside_it(
    bus: NatsServerProcess, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the operator's CLI next to the data directory: admin, which creates the streams
    monkeypatch.setenv("CHAMBER_DATA_DIR", str(data_dir))
    assert login([bus.url])["user"] == "admin"
    admin = await connect(bus.url, name="admin")
    await ensure_streams(admin.jetstream())

    async def as_role(user: str) -> tuple[nats.aio.client.Client, list[str]]:
        monkeypatch.setenv("CHAMBER_NATS_USER", user)
        monkeypatch.setenv("CHAMBER_NATS_PASSWORD_FILE", str(password_file(data_dir, user)))
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        nc = await nats.connect(bus.url, allow_reconnect=False, error_cb=on_error, **login([bus.url]))
        return nc, errors

    async def refused(nc: nats.aio.client.Client, errors: list[str], subject: str) -> bool:
        await nc.publish(subject, b"{}")
        await nc.flush()
        await asyncio.sleep(0.2)  # the server's -ERR comes asynchronously, after the flush's PONG
        return any("permissions violation" in e and subject in e for e in errors)

    quota, quota_errors = await as_role("svc-quota")
    workload, workload_errors = await as_role("workload")
    try:
        assert await refused(quota, quota_errors, "chamber.jobs.forged")  # the scheduler's subject
        assert await refused(quota, quota_errors, "chamber.cmd.scheduler.submit")  # only the gateway commands
        assert await refused(workload, workload_errors, "chamber.cmd.health.restore")
        assert await refused(workload, workload_errors, "chamber.cmd.recorder.sql")
        assert not await refused(workload, workload_errors, "chamber.cmd.quota.set")
    finally:
        for nc in (quota, workload, admin):
            await nc.close()

    monkeypatch.setenv("CHAMBER_NATS_PASSWORD_FILE", str(data_dir / "nats-users" / "nobody"))
    with pytest.raises(CredentialsError, match="no such file"):
        login([bus.url])


def test_the_gateway_reads_its_token_from_the_file_up_names(tmp_path: Path) -> None:
    path = tmp_path / "api-token"
    create_secret(path, "from-a-file")
    assert token_from_file(str(path)) == "from-a-file"
    assert token_from_file(None) is None
