"""Secrets of `chamber up` on disk: a private data directory, files created 0600 from their first
byte (never written, then chmod-ed), per-role NATS users and the nats-server configuration."""

from __future__ import annotations

import os
import secrets
import string
from pathlib import Path

from services.cli.nats_config import Grant, PasswordSource, Permissions, User, render, users
from services.runtime.credentials import OPERATOR, inbox_prefix, users_dir

_ALPHABET = string.ascii_letters + string.digits  # URL-safe, and safe inside the server's config


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) as 0700, and narrow it to 0700 if it was made wider before."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def _write_new(path: Path, text: str) -> Path:
    """A new file beside `path`, mode 0600 from its creation (O_EXCL: never someone else's file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def create_secret(path: Path, value: str | None = None) -> str:
    """The secret in `path`, created whole and 0600 if missing (a random one unless `value` is given).
    Linked into place, so a reader never sees it half-written and a concurrent creator wins cleanly."""
    if not path.exists():
        tmp = _write_new(path, value or "".join(secrets.choice(_ALPHABET) for _ in range(32)))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        finally:
            tmp.unlink()
    elif path.stat().st_mode & 0o077:
        path.chmod(0o600)  # made wider by an older version or by hand
    return path.read_text().strip()


def replace_private(path: Path, text: str) -> None:
    """Write `path` atomically with mode 0600 (a configuration regenerated at each start)."""
    tmp = _write_new(path, text)
    os.replace(tmp, path)


def workload_user() -> User:
    """The demo workload: sets a price and quotas once, then submits jobs; nothing else."""
    verbs = ("chamber.cmd.billing.price", "chamber.cmd.quota.set", "chamber.cmd.scheduler.submit")
    return User(
        "workload",
        "workload",
        Permissions.of(
            [Grant(v, "the demo's commands: a price, quotas, job submissions") for v in verbs],
            [Grant(f"{inbox_prefix('workload')}.>", "its own command replies")],
        ),
        "the demo workload: sets a price and quotas once, then submits jobs",
    )


def stack_users(cluster: str, services: list[str]) -> list[User]:
    """Chamber's roles (`chamber nats-config`) for one machine: a user per service, the simulated
    fleet, one agent user for a real GPU, the demo workload, the operator (`admin`) and `reader`."""
    from services.cli.nats_config import service_manifests

    on_the_bus = [s for s in services if s in service_manifests()]  # the admission webhook has no NATS user
    # no `setup` user: `chamber up` sets the bus up itself, as the operator
    chosen = users(cluster, services=on_the_bus, shared_agent=True, simulator=True, setup=False)
    return [*chosen, workload_user()]


def nats_auth(data_dir: Path, cluster: str, services: list[str], *, extra: str = "") -> Path:
    """Passwords for every user (kept across restarts) and the server's configuration; returns its path.
    `extra` is more server configuration (the telemetry partition mapping)."""
    folder = private_dir(users_dir(data_dir))
    chosen = stack_users(cluster, services)
    for user in chosen:
        create_secret(folder / user.name)
    conf = data_dir / "nats-auth.conf"
    replace_private(conf, render(chosen, PasswordSource(folder)) + extra)
    return conf


def password_file(data_dir: Path, user: str = OPERATOR) -> Path:
    return users_dir(data_dir) / user
