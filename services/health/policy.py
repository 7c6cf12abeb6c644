"""The health policy: which action each fault gets, and the protections around isolation.

The default lives in `default_policy.yaml` (readable, with its sources). An operator's file is merged
over it: sections key by key, an XID or fault kind field by field. `parse_policy` validates and
returns frozen msgspec structs (typed, a misspelt key refused); a mistake is a `PolicyError` naming
the key path and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import yaml

from events.faults import FaultKind, GpuFaultDetected, Severity

DEFAULT_POLICY_PATH = Path(__file__).with_name("default_policy.yaml")
T = TypeVar("T")


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


class _Part(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A part of the policy file: typed, frozen, and a misspelt key is an error, not ignored."""


NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class Escalation(_Part, frozen=True):
    count: Annotated[int, msgspec.Meta(ge=1)]
    window_s: NonNegative
    action: Action


class Rule(_Part, frozen=True):
    severity: Severity
    action: Action
    description: str = ""
    restore: Restore = Restore.PROBATION
    escalate: Escalation | None = None
    if_critical: Action | None = None
    nvidia: str = ""
    dcgm: str = ""
    amd: str = ""  # AMD's documentation for an AMD rule (block, AFID)
    mnemonic: str = ""
    note: str = ""
    key: str = ""  # "xid-79", "ecc_dbe": where the rule sits (set on load); the short code in taints and reasons


class Probation(_Part, frozen=True):
    default_s: NonNegative
    require_clean_sample: bool = True


class Flap(_Part, frozen=True):
    window_s: NonNegative
    multiplier: Annotated[float, msgspec.Meta(ge=1)]
    max_probation_s: NonNegative


class Budget(_Part, frozen=True):
    max_share: Annotated[float, msgspec.Meta(ge=0, le=1)]
    min_nodes: Annotated[int, msgspec.Meta(ge=0)]
    window_s: NonNegative


class _Document(_Part, frozen=True):
    """The file's top level. Rules under `kinds` and `xid` are validated one by one (below), so that an
    error names the kind or the XID: msgspec's own path would show a dict key as `[...]`."""

    probation: Probation
    flap: Flap
    budget: Budget
    unknown_xid: Rule
    kinds: dict[str, Any]
    xid: dict[str | int, Any] = {}
    amd_ras: dict[str, Any] = {}
    amd_afid: dict[str | int, Any] = {}
    version: Literal[1] = 1


class Policy(_Part, frozen=True):
    probation: Probation
    flap: Flap
    budget: Budget
    unknown_xid: Rule
    kinds: dict[FaultKind, Rule]
    xid: dict[int, Rule] = {}
    amd_ras: dict[str, Rule] = {}  # AMD RAS block -> the rule for an uncorrectable error there
    amd_afid: dict[int, Rule] = {}  # AMD Field ID (from a CPER record) -> its rule

    def rule_for(self, fault: GpuFaultDetected) -> Rule:
        if fault.kind == FaultKind.AMD_RAS_UE and fault.ras_block in self.amd_ras:
            return self.amd_ras[fault.ras_block]
        if fault.kind == FaultKind.AMD_CPER and fault.afid is not None and fault.afid in self.amd_afid:
            return self.amd_afid[fault.afid]
        if fault.kind == FaultKind.XID or fault.xid is not None:
            if fault.xid is None:
                return self.unknown_xid
            return self.xid.get(fault.xid) or _replace_key(self.unknown_xid, f"xid-{fault.xid}")
        return self.kinds.get(fault.kind) or self.kinds[FaultKind.OTHER]

    def to_json(self) -> dict[str, Any]:
        """The effective policy in the shape `chamber health policy --json` promises."""

        def rule(r: Rule) -> dict[str, Any]:
            out = {k: v for k, v in msgspec.to_builtins(r).items() if v not in (None, "") and k != "key"}
            return out

        return {
            "version": 1,
            "probation": msgspec.to_builtins(self.probation),
            "flap": msgspec.to_builtins(self.flap),
            "budget": msgspec.to_builtins(self.budget),
            "unknown_xid": rule(self.unknown_xid),
            "kinds": {str(k): rule(r) for k, r in sorted(self.kinds.items())},
            "xid": {str(code): rule(r) for code, r in sorted(self.xid.items())},
            "amd_ras": {block: rule(r) for block, r in sorted(self.amd_ras.items())},
            "amd_afid": {str(afid): rule(r) for afid, r in sorted(self.amd_afid.items())},
        }


def _replace_key(rule: Rule, key: str) -> Rule:
    return msgspec.structs.replace(rule, key=key)


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
    """Validate a merged policy document (msgspec, against the types above) into a `Policy`."""
    doc = _convert(data, _Document, "")
    kinds: dict[FaultKind, Rule] = {}
    for name, raw in doc.kinds.items():
        try:
            kind = FaultKind(name)
        except ValueError:
            raise PolicyError(f"kinds.{name}: unknown fault kind; use one of {[k.value for k in FaultKind]}") from None
        kinds[kind] = _replace_key(_convert(raw, Rule, f"kinds.{name}"), str(kind))
    if FaultKind.OTHER not in kinds:
        raise PolicyError("kinds.other: required (the rule for fault kinds without their own)")
    xids: dict[int, Rule] = {}
    for code, raw in doc.xid.items():
        try:
            number = int(code)
        except (TypeError, ValueError):
            raise PolicyError(f"xid.{code}: XID codes are integers") from None
        xids[number] = _replace_key(_convert(raw, Rule, f"xid.{code}"), f"xid-{number}")
    amd_ras = {
        str(block): _replace_key(_convert(raw, Rule, f"amd_ras.{block}"), f"amd_ras-{block}")
        for block, raw in doc.amd_ras.items()
    }
    amd_afid: dict[int, Rule] = {}
    for code, raw in doc.amd_afid.items():
        try:
            number = int(code)
        except (TypeError, ValueError):
            raise PolicyError(f"amd_afid.{code}: AMD Field IDs are integers") from None
        amd_afid[number] = _replace_key(_convert(raw, Rule, f"amd_afid.{code}"), f"amd_afid-{number}")
    return Policy(
        probation=doc.probation,
        flap=doc.flap,
        budget=doc.budget,
        unknown_xid=_replace_key(doc.unknown_xid, "xid-unknown"),
        kinds=kinds,
        xid=xids,
        amd_ras=amd_ras,
        amd_afid=amd_afid,
    )


def _lookup(raw: Any, path: str) -> Any:
    for part in path.strip(".").split(".") if path.strip(".") else []:
        if not isinstance(raw, Mapping):
            return None
        raw = raw.get(part, raw.get(int(part)) if part.isdigit() else None)
    return None if isinstance(raw, Mapping | list) else raw


_CHOICES: dict[str, type[StrEnum]] = {"action": Action, "if_critical": Action, "severity": Severity, "restore": Restore}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _convert(raw: Any, kind: type[T], where: str) -> T:
    """msgspec validation, its error turned into one line naming the key path (`budget.max_share`)."""
    try:
        return msgspec.convert(raw, kind, strict=False)
    except msgspec.ValidationError as exc:
        m = _AT.match(str(exc))
        what, path = (m["what"], m["path"] or "") if m else (str(exc), "")
        if what.startswith("Expected") and ", got " not in what and (value := _lookup(raw, path)) is not None:
            what += f", got {value!r}"  # a range error: msgspec does not say what it was given
        path = ".".join(p for p in (where, path.lstrip(".")) if p)
        field = path.rsplit(".", 1)[-1]
        if what.startswith("Invalid enum value") and field in _CHOICES:
            what += f"; use one of {[e.value for e in _CHOICES[field]]}"
        missing = re.match(r"Object missing required field `(\w+)`", what)
        if missing:  # name the missing key itself
            path, what = ".".join(p for p in (path, missing[1]) if p), "required"
        raise PolicyError(f"{path or 'policy'}: {what}") from None
