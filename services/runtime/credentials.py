"""Which NATS user a process logs in as, and where its password comes from.

A password never travels in argv or in the environment: `CHAMBER_NATS_USER` names the user and
`CHAMBER_NATS_PASSWORD_FILE` the file that holds its password (what `chamber up` gives each child).
Without them a client logs in as `admin` when the data directory (`CHAMBER_DATA_DIR`, default
`.chamber`) holds that password: the operator's own CLI next to the `chamber up` that made it.
Credentials written into the URL (`nats://user:password@host`) win over both.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

USERS_DIR = "nats-users"  # under the data directory: one file per NATS user, its password
OPERATOR = "admin"


class CredentialsError(RuntimeError):
    """The named password file is missing or empty; the message says which."""


def users_dir(data_dir: Path) -> Path:
    return data_dir / USERS_DIR


def login(servers: list[str]) -> dict[str, str]:
    """`user` and `password` for nats.connect, or {} to connect as given (anonymous or URL credentials)."""
    if any(urlparse(s if "://" in s else f"nats://{s}").username for s in servers):
        return {}
    user = os.environ.get("CHAMBER_NATS_USER") or OPERATOR
    named = os.environ.get("CHAMBER_NATS_PASSWORD_FILE")
    if named:
        path = Path(named)
        if not path.is_file():
            raise CredentialsError(f"CHAMBER_NATS_PASSWORD_FILE={named}: no such file (NATS user {user!r})")
    else:
        path = users_dir(Path(os.environ.get("CHAMBER_DATA_DIR", ".chamber"))) / user
        if not path.is_file():
            return {}
    password = path.read_text().strip()
    if not password:
        raise CredentialsError(f"{path} is empty: no password for NATS user {user!r}")
    return {"user": user, "password": password}


def inbox_prefix(user: str) -> str:
    """Where a user's replies arrive: `_INBOX.<user>.<id>`. Its NATS role may subscribe there and
    nowhere else under `_INBOX`, so no one reads another client's replies."""
    return f"_INBOX.{user}"


def user_of(servers: list[str], credentials: dict[str, str]) -> str | None:
    """The user a connection logs in as: from `credentials`, else from the first URL that names one."""
    if credentials.get("user"):
        return credentials["user"]
    for s in servers:
        name = urlparse(s if "://" in s else f"nats://{s}").username
        if name:
            return unquote(name)
    return None
