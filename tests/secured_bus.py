"""The bus as deployed: nats-server with the users and permissions `chamber nats-config` generates.

`chamber up` (services/stack/credentials.py `stack_users`) and the chart (`chamber nats-config` in
its init container) render their users from the same functions in services/cli/nats_config.py;
the test fixture does too, so a service test that needs a subject its role may not use fails here
instead of in an operator's log.

A role is a service name (`scheduler` logs in as `svc-scheduler`) or a user name (`admin`,
`reader`, `simulator`, `agent`, `workload`, `svc-...`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Sequence
from pathlib import Path

from nats.aio.client import Client

from services.cli.nats_config import (
    DEFAULT_SERVICES,
    MULTI_CLUSTER_SERVICES,
    PasswordSource,
    render,
    users,
)
from services.runtime import connect
from services.runtime.nats_server import NatsServerProcess
from services.stack.credentials import stack_users

CLUSTER = "c1"  # the cluster of the services' permissions (fleet and fault subjects carry it)
_VIOLATION = re.compile(r"^.*(Publish|Subscription) Violation.*$", re.IGNORECASE | re.MULTILINE)


def user_of(role: str) -> str:
    """`scheduler` -> `svc-scheduler`; a user name stays as it is."""
    return f"svc-{role}" if role in DEFAULT_SERVICES + MULTI_CLUSTER_SERVICES else role


class SecuredNatsServer(NatsServerProcess):
    """A NatsServerProcess under `chamber up`'s users. `url` logs in as `admin` (the operator's CLI and
    the tests' own checks); `url_for(role)` as that role; the server's log names every refusal."""

    def __init__(self, tmp: Path, cluster: str = CLUSTER, actuator_clusters: Sequence[str] = ()) -> None:
        self.passwords = PasswordSource(tmp / "nats-users", create_missing=True)
        self.users = {u.name: u for u in stack_users(cluster, list(DEFAULT_SERVICES))}
        if actuator_clusters:  # multi-cluster dispatch: the dispatcher and each cluster's actuator
            services = [*DEFAULT_SERVICES, *MULTI_CLUSTER_SERVICES]
            self.users |= {u.name: u for u in users(cluster, services=services, actuator_clusters=actuator_clusters)}
        conf = tmp / "nats-auth.conf"
        conf.write_text(render(list(self.users.values()), self.passwords))
        super().__init__(tmp / "jetstream", log_file=tmp / "nats-server.log", extra_args=["-c", str(conf)])
        self._set_up = False

    def start(self, timeout_s: float = 15.0) -> None:
        """Start, then (the first time) set the bus up as `chamber up` and the chart's set-up Job do,
        as admin: services may not create streams or buckets themselves."""
        super().start(timeout_s)
        if not self._set_up:
            self._set_up = True
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a test's event loop may be running
                pool.submit(asyncio.run, self._run_set_up()).result()

    async def _run_set_up(self) -> None:
        from services.runtime.setup import set_up

        nc = await connect(self.url, name="test-setup")
        try:
            await set_up(nc.jetstream())
        finally:
            await nc.close()

    @property
    def url(self) -> str:
        return self.url_for("admin")

    @property
    def anonymous_url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def url_for(self, role: str) -> str:
        user = user_of(role)
        if user not in self.users:
            raise KeyError(f"no NATS user {user!r}: the roles are {sorted(self.users)}")
        return f"nats://{user}:{self.passwords.password(user)}@{self.host}:{self.port}"

    def violations(self) -> list[str]:
        """Every permission the server refused so far (see `violations_in`)."""
        return violations_in(self.log_file) if self.log_file is not None else []


def violations_in(log: Path) -> list[str]:
    """The refusals in a nats-server log, one line each (e.g. `... "$G/user:svc-scheduler" - Publish
    Violation - Subject "$O.chamber_snapshots.C..."`)."""
    if not log.exists():
        return []
    return [m.group(0) for m in _VIOLATION.finditer(log.read_text(errors="replace"))]


async def connect_as(server: SecuredNatsServer, role: str, *, name: str | None = None) -> Client:
    """A client logged in as `role` (see `user_of`)."""
    return await connect(server.url_for(role), name=name or user_of(role))


async def lease_bucket_with_ttl(server: SecuredNatsServer, service: str, ttl_s: float) -> None:
    """The set-up made `service`'s lease bucket with the deployed TTL, and a lease takes its bucket's
    TTL (services may not create buckets): as admin, make it again with a test's short one."""
    from services.runtime.buckets import open_kv
    from services.runtime.manifest import lease_bucket

    nc = await connect(server.url, name="test-admin")
    try:
        js = nc.jetstream()
        await js.delete_key_value(lease_bucket(service))
        await open_kv(js, lease_bucket(service), history=1, ttl=ttl_s)
    finally:
        await nc.close()
