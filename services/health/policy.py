"""The health policy: which action each fault gets, and the protections around isolation.

The default lives in `default_policy.yaml` (readable, with its sources). An operator's file is merged
over it: sections key by key, an XID or fault kind field by field. `parse_policy` validates and
returns frozen values; a mistake is a `PolicyError` naming the key path and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from events.faults import FaultKind, GpuFaultDetected, Severity

DEFAULT_POLICY_PATH = Path(__file__).with_name("default_policy.yaml")


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the key and what is allowed."""


class Action(StrEnum):
    RECORD = "record"
    ISOLATE_GPU = "isolate_gpu"
    ISOLATE_NODE = "isolate_node"


# Stronger actions win when several apply (escalation, if_critical, node-level faults).
RANK = {Action.RECORD: 0, Action.ISOLATE_GPU: 1, Action.ISOLATE_NODE: 2}


class Restore(StrEnum):
    PROBATION = "probation"
    MANUAL = "manual"


@dataclass(frozen=True)
class Escalation:
    count: int
    window_s: float
    action: Action


@dataclass(frozen=True)
class Rule:
    key: str  # "xid-79", "ecc_dbe": also the short code in taints and reasons
    severity: Severity
    action: Action
    description: str
    restore: Restore = Restore.PROBATION
    escalate: Escalation | None = None
    if_critical: Action | None = None
    nvidia: str = ""
    dcgm: str = ""
    mnemonic: str = ""
    note: str = ""


@dataclass(frozen=True)
class Probation:
    default_s: float
    require_clean_sample: bool


@dataclass(frozen=True)
class Flap:
    window_s: float
    multiplier: float
    max_probation_s: float


@dataclass(frozen=True)
class Budget:
    max_share: float
    min_nodes: int
    window_s: float


@dataclass(frozen=True)
class Policy:
    probation: Probation
    flap: Flap
    budget: Budget
    unknown_xid: Rule
    kinds: dict[FaultKind, Rule]
    xid: dict[int, Rule] = field(default_factory=dict)

    def rule_for(self, fault: GpuFaultDetected) -> Rule:
        if fault.kind == FaultKind.XID or fault.xid is not None:
            if fault.xid is None:
                return self.unknown_xid
            return self.xid.get(fault.xid) or _replace_key(self.unknown_xid, f"xid-{fault.xid}")
        return self.kinds.get(fault.kind) or self.kinds[FaultKind.OTHER]

    def to_json(self) -> dict[str, Any]:
        """The effective policy in the shape `chamber health policy --json` promises."""

        def rule(r: Rule) -> dict[str, Any]:
            out = {k: v for k, v in asdict(r).items() if v not in (None, "") and k != "key"}
            return {str(k): (str(v) if isinstance(v, StrEnum) else v) for k, v in out.items()}

        return {
            "version": 1,
            "probation": asdict(self.probation),
            "flap": asdict(self.flap),
            "budget": asdict(self.budget),
            "unknown_xid": rule(self.unknown_xid),
            "kinds": {str(k): rule(r) for k, r in sorted(self.kinds.items())},
            "xid": {str(code): rule(r) for code, r in sorted(self.xid.items())},
        }


def _replace_key(rule: Rule, key: str) -> Rule:
    from dataclasses import replace

    return replace(rule, key=key)


def merge(base: Mapping[str, Any], override: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """Deep merge for policy files: mappings merge (XID and kind rules field by field), values replace."""
    out = dict(base)
    for key, value in override.items():
        k = _norm_key(key, base)
        if isinstance(value, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], value, depth + 1)
        else:
            out[k] = value
    return out


def _norm_key(key: Any, base: Mapping[str, Any]) -> Any:
    # YAML gives int keys for `79:` and str keys for `"79":`; match whichever the base uses.
    if isinstance(key, str) and key.isdigit() and int(key) in base:
        return int(key)
    return key


def load_policy(path: Path | None = None) -> Policy:
    """The default policy, with the operator's file (if any) merged over it."""
    data = _read(DEFAULT_POLICY_PATH)
    if path is not None:
        data = merge(data, _read(path))
    return parse_policy(data)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyError(f"policy file {path} must hold a mapping at the top level")
    return data


def parse_policy(data: Mapping[str, Any]) -> Policy:
    p = _section(data, "probation")
    f = _section(data, "flap")
    b = _section(data, "budget")
    budget = Budget(
        max_share=_num(b, "max_share", "budget", 0.0, 1.0),
        min_nodes=int(_num(b, "min_nodes", "budget", 0)),
        window_s=_num(b, "window_s", "budget", 0.0),
    )
    kinds: dict[FaultKind, Rule] = {}
    for name, raw in (data.get("kinds") or {}).items():
        try:
            kind = FaultKind(name)
        except ValueError:
            raise PolicyError(f"kinds.{name}: unknown fault kind; use one of {[k.value for k in FaultKind]}") from None
        kinds[kind] = _rule(raw, str(kind), f"kinds.{name}")
    if FaultKind.OTHER not in kinds:
        raise PolicyError("kinds.other: required (the rule for fault kinds without their own)")
    xids: dict[int, Rule] = {}
    for code, raw in (data.get("xid") or {}).items():
        try:
            number = int(code)
        except (TypeError, ValueError):
            raise PolicyError(f"xid.{code}: XID codes are integers") from None
        xids[number] = _rule(raw, f"xid-{number}", f"xid.{code}")
    return Policy(
        probation=Probation(
            default_s=_num(p, "default_s", "probation", 0.0),
            require_clean_sample=bool(p.get("require_clean_sample", True)),
        ),
        flap=Flap(
            window_s=_num(f, "window_s", "flap", 0.0),
            multiplier=_num(f, "multiplier", "flap", 1.0),
            max_probation_s=_num(f, "max_probation_s", "flap", 0.0),
        ),
        budget=budget,
        unknown_xid=_rule(data.get("unknown_xid") or {}, "xid-unknown", "unknown_xid"),
        kinds=kinds,
        xid=xids,
    )


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name)
    if not isinstance(value, Mapping):
        raise PolicyError(f"{name}: required section (a mapping)")
    return value


def _num(section: Mapping[str, Any], key: str, where: str, lo: float, hi: float | None = None) -> float:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"{where}.{key}: required number")
    if value < lo or (hi is not None and value > hi):
        bounds = f">= {lo:g}" if hi is None else f"between {lo:g} and {hi:g}"
        raise PolicyError(f"{where}.{key}: {value} is out of range; use a number {bounds}")
    return float(value)


def _enum(enum: type[StrEnum], value: Any, where: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise PolicyError(f"{where}: {value!r} is not allowed; use one of {[e.value for e in enum]}") from None


def _rule(raw: Any, key: str, where: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: a rule is a mapping with at least severity and action")
    if "severity" not in raw or "action" not in raw:
        raise PolicyError(f"{where}: a rule needs severity and action")
    escalate = None
    if raw.get("escalate") is not None:
        e = raw["escalate"]
        if not isinstance(e, Mapping):
            raise PolicyError(f"{where}.escalate: use {{count: N, window_s: S, action: ACTION}}")
        escalate = Escalation(
            count=max(1, int(_num(e, "count", f"{where}.escalate", 1))),
            window_s=_num(e, "window_s", f"{where}.escalate", 0.0),
            action=_enum(Action, e.get("action"), f"{where}.escalate.action"),
        )
    if_critical = raw.get("if_critical")
    return Rule(
        key=key,
        severity=_enum(Severity, raw["severity"], f"{where}.severity"),
        action=_enum(Action, raw["action"], f"{where}.action"),
        description=str(raw.get("description", "")),
        restore=_enum(Restore, raw.get("restore", "probation"), f"{where}.restore"),
        escalate=escalate,
        if_critical=None if if_critical is None else _enum(Action, if_critical, f"{where}.if_critical"),
        nvidia=str(raw.get("nvidia", "")),
        dcgm=str(raw.get("dcgm", "")),
        mnemonic=str(raw.get("mnemonic", "")),
        note=str(raw.get("note", "")),
    )
