"""The health policy: which action each fault gets, and the protections around isolation.

The default lives in `default_policy.yaml` (readable, with its sources). An operator's file is merged
over it: sections key by key, an XID or fault kind field by field. `parse_policy` validates and
returns frozen values; the file's schema is msgspec's (`_PolicySpec`): a mistake, a misspelt key
included, is a `PolicyError` naming the key path and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
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


# -- the file's schema: msgspec checks types, ranges, enums and unknown (misspelt) keys -------------
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _File(msgspec.Struct, forbid_unknown_fields=True):
    """Base of the file's sections: a key the schema does not know is a mistake, not ignored."""


class _EscalationSpec(_File):
    count: Annotated[int, msgspec.Meta(ge=1)]
    window_s: NonNegative
    action: Action


class _RuleSpec(_File):
    severity: Severity
    action: Action
    description: str = ""
    restore: Restore = Restore.PROBATION
    escalate: _EscalationSpec | None = None
    if_critical: Action | None = None
    nvidia: str = ""
    dcgm: str = ""
    mnemonic: str = ""
    note: str = ""


class _ProbationSpec(_File):
    default_s: NonNegative
    require_clean_sample: bool = True


class _FlapSpec(_File):
    window_s: NonNegative
    multiplier: Annotated[float, msgspec.Meta(ge=1)]
    max_probation_s: NonNegative


class _BudgetSpec(_File):
    max_share: Annotated[float, msgspec.Meta(ge=0, le=1)]
    min_nodes: Annotated[int, msgspec.Meta(ge=0)]
    window_s: NonNegative


class _PolicySpec(_File):
    probation: _ProbationSpec
    flap: _FlapSpec
    budget: _BudgetSpec
    unknown_xid: _RuleSpec
    kinds: dict[str, Any]  # each rule is checked on its own, so an error names its kind or XID
    xid: dict[Any, Any] = {}
    version: Literal[1] = 1


_ENUMS: dict[str, type[StrEnum]] = {"action": Action, "if_critical": Action, "severity": Severity, "restore": Restore}


def _convert(data: Any, spec: type[_File], where: str = "") -> Any:
    """msgspec's check, its error turned into a PolicyError naming the key path and what is allowed."""
    try:
        return msgspec.convert(data, spec)
    except msgspec.ValidationError as exc:
        reason, _, at = str(exc).partition(" - at `")
        path = at.rstrip("`").removeprefix("$").lstrip(".")
        full = ".".join(p for p in (where, path) if p) or "policy"
        field_name = full.rsplit(".", 1)[-1]
        if reason.startswith("Invalid enum value") and field_name in _ENUMS:
            reason += f"; use one of {[e.value for e in _ENUMS[field_name]]}"
        raise PolicyError(f"{full}: {reason}") from None


def parse_policy(data: Mapping[str, Any]) -> Policy:
    spec: _PolicySpec = _convert(data, _PolicySpec)
    kinds: dict[FaultKind, Rule] = {}
    for name, raw in spec.kinds.items():
        try:
            kind = FaultKind(name)
        except ValueError:
            raise PolicyError(f"kinds.{name}: unknown fault kind; use one of {[k.value for k in FaultKind]}") from None
        kinds[kind] = _rule(_convert(raw, _RuleSpec, f"kinds.{name}"), str(kind))
    if FaultKind.OTHER not in kinds:
        raise PolicyError("kinds.other: required (the rule for fault kinds without their own)")
    xids: dict[int, Rule] = {}
    for code, raw in spec.xid.items():
        try:
            number = int(code)
        except (TypeError, ValueError):
            raise PolicyError(f"xid.{code}: XID codes are integers") from None
        xids[number] = _rule(_convert(raw, _RuleSpec, f"xid.{code}"), f"xid-{number}")
    return Policy(
        probation=Probation(spec.probation.default_s, spec.probation.require_clean_sample),
        flap=Flap(spec.flap.window_s, spec.flap.multiplier, spec.flap.max_probation_s),
        budget=Budget(spec.budget.max_share, spec.budget.min_nodes, spec.budget.window_s),
        unknown_xid=_rule(spec.unknown_xid, "xid-unknown"),
        kinds=kinds,
        xid=xids,
    )


def _rule(r: _RuleSpec, key: str) -> Rule:
    e = r.escalate
    return Rule(
        key=key,
        severity=r.severity,
        action=r.action,
        description=r.description,
        restore=r.restore,
        escalate=None if e is None else Escalation(e.count, e.window_s, e.action),
        if_critical=r.if_critical,
        nvidia=r.nvidia,
        dcgm=r.dcgm,
        mnemonic=r.mnemonic,
        note=r.note,
    )
