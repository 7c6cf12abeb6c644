"""Which teams a namespace may charge, and the Kueue vocabulary mapped onto Chamber's.

A small CRD-free file (the chart renders it into a ConfigMap from Helm values, mounted by the
webhook and the scheduler):

    namespaces:
      ml-vision:
        teams: [vision]              # teams workloads here may charge (the first is the default)
        queues: {main: vision}       # kueue.x-k8s.io/queue-name (a LocalQueue) -> team
    priorities:                      # kueue.x-k8s.io/priority-class (WorkloadPriorityClass) -> class
      prod-critical: critical
      batch: low

A workload names its team with `chamber.io/team`, or with `kueue.x-k8s.io/queue-name` through its
namespace's queues (a queue named like a bound team is that team). Its class is `chamber.io/priority`
or `kueue.x-k8s.io/priority-class`: a Chamber class name, or a name under `priorities`. Without a
bindings file every namespace may charge every team (the behaviour before bindings existed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import yaml

from events import PriorityClass, names

TEAM_LABEL = "chamber.io/team"
PRIORITY_LABEL = "chamber.io/priority"
PREEMPTIBLE_LABEL = "chamber.io/preemptible"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def is_team(name: str) -> bool:
    """Kubernetes label values allow upper case, `_` and `.`; team names (and NATS subject tokens) do
    not. Upper case is folded first (`normalize_team`); anything else is refused rather than silently
    mapped onto another team. The one team rule is events.names'."""
    try:
        return names.normalize_team(name) == name
    except names.InvalidName:
        return False


class BindingsError(ValueError):
    pass


class NamespaceBinding(msgspec.Struct, forbid_unknown_fields=True):
    teams: list[str] = []
    queues: dict[str, str] = {}


class Bindings(msgspec.Struct, forbid_unknown_fields=True):
    namespaces: dict[str, NamespaceBinding] = {}
    priorities: dict[str, PriorityClass] = {}
    open: bool = False  # no bindings file: any namespace may charge any team

    @classmethod
    def load(cls, path: str | Path | None) -> Bindings:
        if path is None:
            return cls(open=True)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
            bindings = msgspec.convert(raw, cls)
        except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
            raise BindingsError(f"bindings file {path}: {exc}") from None
        for ns, binding in bindings.namespaces.items():
            for team in [*binding.teams, *binding.queues.values()]:
                if not is_team(team):
                    raise BindingsError(f"bindings file {path}: namespaces.{ns}: {team!r} is not a team name")
        return bindings


@dataclass(frozen=True)
class Claim:
    """What a workload's labels ask for, once checked against the bindings."""

    team: str
    priority: PriorityClass
    preemptible: bool


def normalize_team(value: str) -> str:
    return value.strip().lower()  # then `is_team` checks it (events.names.normalize_team's first step)


def claim(labels: dict[str, str], namespace: str, bindings: Bindings) -> Claim | str | None:
    """The workload's team, class and preemptibility; a refusal (naming the fix); or None if it names no
    team and no Kueue queue (not Chamber's)."""
    team_label, queue = labels.get(TEAM_LABEL), labels.get(KUEUE_QUEUE_LABEL)
    if team_label is None and queue is None:
        return None
    binding = bindings.namespaces.get(namespace)
    team: str | None = None
    if team_label is not None:
        team = normalize_team(team_label)
        if not is_team(team):
            return (
                f"label {TEAM_LABEL}={team_label!r} is not a team name: use lower-case letters, digits and '-' "
                "(at most 63, starting and ending with a letter or digit)"
            )
    if queue is not None:
        queue_team = _queue_team(queue, namespace, binding, bindings)
        if queue_team is None:
            return (
                f"Kueue queue {queue!r} maps to no team in namespace {namespace!r}: add it under "
                f"namespaces.{namespace}.queues in Chamber's bindings (Helm value kube.bindings), or label the "
                f"workload {TEAM_LABEL}"
            )
        if team is not None and team != queue_team:
            return f"label {TEAM_LABEL}={team} contradicts queue {queue!r}, which charges team {queue_team}"
        team = queue_team
    assert team is not None
    if not bindings.open:
        allowed = binding.teams if binding else []
        if team not in allowed and team not in (binding.queues.values() if binding else ()):
            if not allowed:
                return (
                    f"namespace {namespace!r} may charge no team: an administrator binds it under "
                    f"namespaces.{namespace}.teams in Chamber's bindings (Helm value kube.bindings)"
                )
            return (
                f"namespace {namespace!r} may not charge team {team!r}; it may charge {', '.join(allowed)}: "
                f"label the workload with one of them, or have team {team} bound to this namespace"
            )
    priority = _priority(labels, bindings)
    if not isinstance(priority, PriorityClass):  # a refusal (PriorityClass is a str too)
        return priority
    preemptible = labels.get(PREEMPTIBLE_LABEL, "true").strip().lower() != "false"
    return Claim(team, priority, preemptible)


def _queue_team(queue: str, namespace: str, binding: NamespaceBinding | None, bindings: Bindings) -> str | None:
    if binding is not None and queue in binding.queues:
        return binding.queues[queue]
    name = normalize_team(queue)
    if binding is not None and name in binding.teams:
        return name
    if bindings.open and is_team(name):
        return name
    return None


# The classes a label may name: `serving` is given to the replicas of serving workloads, not asked for.
LABEL_CLASSES = tuple(c.value for c in PriorityClass if c != PriorityClass.SERVING)


def _priority(labels: dict[str, str], bindings: Bindings) -> PriorityClass | str:
    for label in (PRIORITY_LABEL, KUEUE_PRIORITY_LABEL):
        value = labels.get(label)
        if value is None:
            continue
        key = value.strip()
        if key.lower() in LABEL_CLASSES:
            return PriorityClass(key.lower())
        if key in bindings.priorities:
            return bindings.priorities[key]
        known = [*LABEL_CLASSES, *sorted(bindings.priorities)]
        return (
            f"unknown priority {label}={value!r}: use one of {', '.join(known)}, or map this "
            "WorkloadPriorityClass under priorities in Chamber's bindings (Helm value kube.bindings.priorities)"
        )
    return PriorityClass.NORMAL
