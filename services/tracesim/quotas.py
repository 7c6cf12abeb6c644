"""Quota sets for the simulator (TOML): `[pools.<name>] gpus = N`, `[teams.<name>] pool, guaranteed,
borrow_limit, lend_limit, np_lend_limit, weight, critical`. Without a file every team is guaranteed an equal share.
Simulated teams may run critical work unless the file says `critical = false`: the simulator replays
the classes the trace asks for."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from services.tracesim.trace import TraceError


@dataclass(frozen=True)
class TeamQuota:
    team: str
    pool: str
    guaranteed: int
    borrow_limit: int | None = None
    lend_limit: int | None = None
    weight: float = 1.0
    critical: bool = True  # the simulator replays the classes the trace asks for (TOML: critical = false)
    np_lend_limit: int | None = (
        None  # idle guarantee lent to others' non-preemptible work (None: half of what it lends)
    )


def equal_shares(teams: list[str], gpus: int, pool: str = "default") -> dict[str, TeamQuota]:
    """Each team guaranteed gpus / teams (the remainder to the first teams, so they add up)."""
    base, extra = divmod(gpus, max(len(teams), 1))
    return {t: TeamQuota(t, pool, base + (1 if i < extra else 0)) for i, t in enumerate(sorted(teams))}


def load_quotas(path: Path, teams: list[str], gpus: int) -> dict[str, TeamQuota]:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise TraceError(f"quotas file {path} does not exist") from None
    except UnicodeDecodeError:
        raise TraceError(f"quotas file {path} is not UTF-8 text (TOML)") from None
    except tomllib.TOMLDecodeError as exc:
        raise TraceError(f"quotas file {path} is not valid TOML: {exc}") from None
    pools = doc.get("pools", {"default": {"gpus": gpus}})
    quotas: dict[str, TeamQuota] = {}
    for team, spec in (doc.get("teams") or {}).items():
        where = f"{path} [teams.{team}]"
        pool = spec.get("pool", "default")
        if pool not in pools:
            raise TraceError(f"{where}: pool {pool!r} is not defined under [pools]")
        guaranteed = spec.get("guaranteed", 0)
        if not isinstance(guaranteed, int) or guaranteed < 0:
            raise TraceError(f"{where}: guaranteed must be a whole number of GPUs, 0 or more")
        for key in ("borrow_limit", "lend_limit", "np_lend_limit"):
            value = spec.get(key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise TraceError(f"{where}: {key} must be a whole number of GPUs, 0 or more")
        weight = spec.get("weight", 1.0)
        if not isinstance(weight, int | float) or weight <= 0:
            raise TraceError(f"{where}: weight must be a number above 0")
        critical = spec.get("critical", True)
        if not isinstance(critical, bool):
            raise TraceError(f"{where}: critical must be true or false")
        quotas[team] = TeamQuota(
            team,
            pool,
            guaranteed,
            spec.get("borrow_limit"),
            spec.get("lend_limit"),
            float(weight),
            critical,
            spec.get("np_lend_limit"),
        )
    total = sum(q.guaranteed for q in quotas.values())
    if total > gpus:
        raise TraceError(f"{path}: guarantees add up to {total} GPUs, more than the fleet's {gpus}")
    for team in teams:  # teams in the trace but not in the file get no guarantee: they only borrow
        quotas.setdefault(team, TeamQuota(team, "default" if "default" in pools else next(iter(pools)), 0))
    return quotas
