"""A leader lease in JetStream KV: one active holder (e.g. the scheduler), the others hot standbys.

The lease is one key in a KV bucket whose entries expire after `ttl_s` (the stream's max age):
- a candidate `create`s the key; that succeeds only when no live entry exists;
- the holder renews every ttl/3 with an optimistic `update(last=revision)`, so a second holder can
  never overwrite it; a renewal refused that way means someone else holds it: step down at once;
- a holder that cannot reach NATS steps down on its own clock at `ttl - ttl/3` after its last
  renewal, before the server can expire the key and hand the lease to a standby (no two leaders);
- a holder that stops deletes the key (`last=revision`), so a standby takes over within ttl/3.

In Kubernetes the chart sets CHAMBER_LEADER_LEASE (the lease name) and CHAMBER_LEADER_LEASE_TTL_S;
`from_env` builds the lease from them (holder id: $POD_NAME, else the host name).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from events.subjects import token
from services.runtime.buckets import open_kv
from services.runtime.logs import get_logger
from services.runtime.manifest import lease_bucket
from services.runtime.replicas import replicas_for

log = get_logger("chamber.runtime.lease")

ENV_NAME = "CHAMBER_LEADER_LEASE"
ENV_TTL = "CHAMBER_LEADER_LEASE_TTL_S"
OnChange = Callable[[bool], Awaitable[None]]


class LeaderLease:
    def __init__(self, js: JetStreamContext, name: str, holder: str, *, ttl_s: float = 15.0, service: str = "") -> None:
        """The lease `name` of `service` (default: a service of that name): key `name` in the
        service's own lease bucket, the one bucket its NATS role may write leases in."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.js = js
        self.name = token(name)
        self.holder = holder
        self.ttl_s = ttl_s
        self.bucket = lease_bucket(service or name)
        # a service's own lease (named after it) keeps the key `leader`; others are keyed by name
        self.key = "leader" if not service or token(service) == self.name else self.name
        self._kv: KeyValue | None = None
        self._revision: int | None = None
        self.renewed_at = 0.0  # monotonic time of the last successful create/renew
        self.changes = 0  # how often leadership flipped (for tests and the health report)

    @property
    def is_leader(self) -> bool:
        """True only while a renewal is recent enough that the server cannot have expired the key."""
        return self._revision is not None and time.monotonic() - self.renewed_at < self.ttl_s * 2 / 3

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            kv = await open_kv(self.js, self.bucket, history=1, ttl=self.ttl_s, replicas=replicas_for(self.js))
            # The set-up made the bucket (services may not): its entries expire after ITS ttl, so
            # that is the lease's, whatever was asked; renewing on a longer one would outlive the key.
            ttl = (await kv.status()).ttl
            if ttl and ttl != self.ttl_s:
                log.warning("lease ttl is the bucket's", lease=self.name, asked_s=self.ttl_s, bucket_s=ttl)
                self.ttl_s = float(ttl)
            self._kv = kv
        return self._kv

    async def try_acquire_or_renew(self) -> bool:
        """One round: renew if holding, else try to take the lease. Returns whether we hold it."""
        kv = await self._bucket()
        started = time.monotonic()  # a renewal counts from when it was sent, not when it was acked
        try:
            if self._revision is None:
                self._revision = await kv.create(self.key, self.holder.encode())
            else:
                self._revision = await kv.update(self.key, self.holder.encode(), last=self._revision)
            self.renewed_at = started
            return True
        except KeyWrongLastSequenceError:  # someone else holds it (or took it while we were away)
            self._revision = None
            return False

    async def release(self) -> None:
        if self._revision is None:
            return
        revision, self._revision = self._revision, None
        kv = await self._bucket()
        with contextlib.suppress(KeyWrongLastSequenceError, NotFoundError, nats.errors.Error):
            await kv.delete(self.key, last=revision)

    async def run(self, stop: asyncio.Event, on_change: OnChange | None = None) -> None:
        """Hold or wait for the lease until `stop`; `on_change(leading)` on every flip."""
        was_leader = False
        try:
            while not stop.is_set():
                try:  # bounded: a publish waiting out a NATS outage must not keep a lapsed leader acting
                    await asyncio.wait_for(self.try_acquire_or_renew(), timeout=self.ttl_s / 3)
                except (nats.errors.Error, TimeoutError) as exc:  # NATS away: is_leader lapses on its own
                    log.warning("lease round failed", lease=self.name, holder=self.holder, error=repr(exc))
                leading = self.is_leader
                if leading != was_leader:
                    was_leader = leading
                    self.changes += 1
                    log.info("leadership changed", lease=self.name, holder=self.holder, leader=leading)
                    if on_change is not None:
                        await on_change(leading)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.ttl_s / 3)
        finally:
            await self.release()
            if was_leader and on_change is not None:
                await on_change(False)


def from_env(js: JetStreamContext, service: str = "") -> LeaderLease | None:
    """The lease the deployment asks for ($CHAMBER_LEADER_LEASE), or None to always lead."""
    name = os.environ.get(ENV_NAME, "").strip()
    if not name:
        return None
    ttl = float(os.environ.get(ENV_TTL, "15"))
    holder = os.environ.get("POD_NAME") or socket.gethostname()
    return LeaderLease(js, name, holder, ttl_s=ttl, service=service)
