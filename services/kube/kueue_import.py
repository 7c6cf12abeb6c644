"""Kueue objects (YAML) converted into Chamber quota commands and namespace bindings, pure.

- ResourceFlavor with one node label -> a pool (`chamber quota pool set FLAVOR --node-label K=V`);
  without labels -> pool `default`.
- ClusterQueue -> a team named like it; its `nvidia.com/gpu` nominalQuota / borrowingLimit /
  lendingLimit per flavor -> `chamber quota set TEAM --pool FLAVOR --gpus --borrow-limit --lend-limit`;
  `fairSharing.weight` -> `--weight`; no `cohort` -> `--borrow-limit 0 --lend-limit 0` (a queue alone
  neither borrows nor lends); a `cohort` -> the teams of one pool (Chamber lends within a pool).
- LocalQueue (namespace, name -> ClusterQueue) -> bindings `namespaces.NS.teams` and `.queues`.
- WorkloadPriorityClass -> bindings `priorities` by rank: the highest high, the lowest low, the rest
  normal (`critical`, which preempts across teams, is never given away by an import).

What has no equivalent is refused with the reason (nothing is silently dropped): hierarchical or
quota-holding Cohorts, two cohorts sharing a flavor (one Chamber pool would let them borrow from
each other), flavors selecting by several labels, StrictFIFO, borrowWithinCohort, reclaimWithinCohort
Never, admission checks, stop policies, non-GPU quotas.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from services.kube.bindings import is_team
from services.kube.resources import GPU_RESOURCE

KUEUE_GROUP = "kueue.x-k8s.io"


@dataclass
class Conversion:
    commands: list[str] = field(default_factory=list)
    bindings: dict[str, Any] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)


def _whole(value: Any, where: str, refused: list[str]) -> int | None:
    if value is None:
        return None
    try:
        n = int(str(value))
    except ValueError:
        refused.append(f"{where}: {value!r} is not a whole number of GPUs")
        return None
    if n < 0:
        refused.append(f"{where}: {n} is negative")
        return None
    return n


def convert(docs: list[Any]) -> Conversion:
    out = Conversion()
    objects: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        api = str(doc.get("apiVersion") or "")
        if not api.startswith(KUEUE_GROUP + "/"):
            out.refused.append(f"{doc.get('kind')} {_name(doc)}: not a Kueue object ({api or 'no apiVersion'})")
            continue
        objects.setdefault(str(doc.get("kind")), []).append(doc)
    known = {"ResourceFlavor", "ClusterQueue", "LocalQueue", "Cohort", "WorkloadPriorityClass"}
    for kind in sorted(set(objects) - known):
        for doc in objects[kind]:
            out.refused.append(f"{kind} {_name(doc)}: Chamber has no equivalent of a Kueue {kind}")

    for cohort in objects.get("Cohort", []):
        spec = cohort.get("spec") or {}
        if spec.get("parentName") or spec.get("parent"):
            out.refused.append(
                f"Cohort {_name(cohort)}: hierarchical cohorts have no equivalent (a Chamber pool is flat); "
                "flatten it into one cohort"
            )
        if spec.get("resourceGroups"):
            out.refused.append(
                f"Cohort {_name(cohort)}: quota held by a cohort itself has no equivalent; give it to its queues"
            )

    pools = _pools(objects.get("ResourceFlavor", []), out)
    _queues(objects.get("ClusterQueue", []), pools, out)
    _local_queues(objects.get("LocalQueue", []), {_name(c) for c in objects.get("ClusterQueue", [])}, out)
    _priorities(objects.get("WorkloadPriorityClass", []), out)
    return out


def _name(doc: dict[str, Any]) -> str:
    return str((doc.get("metadata") or {}).get("name") or "?")


def _pools(flavors: list[dict[str, Any]], out: Conversion) -> dict[str, str | None]:
    """Flavor name -> pool name (None: refused). A flavor without node labels is the `default` pool."""
    pools: dict[str, str | None] = {}
    for flavor in sorted(flavors, key=_name):
        name = _name(flavor)
        labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
        if not labels:
            pools[name] = "default"
        elif len(labels) > 1:
            out.refused.append(
                f"ResourceFlavor {name}: selects nodes by {len(labels)} labels ({', '.join(sorted(labels))}); a "
                "Chamber pool selects by one: label those nodes with one key and define the pool with it"
            )
            pools[name] = None
        elif not is_team(name):
            out.refused.append(f"ResourceFlavor {name}: {name!r} is not a valid pool name ([a-z0-9-])")
            pools[name] = None
        else:
            [(key, value)] = labels.items()
            out.commands.append(f"chamber quota pool set {name} --node-label {shlex.quote(f'{key}={value}')}")
            pools[name] = name
        for key in ("nodeTaints", "tolerations", "topologyName"):
            if (flavor.get("spec") or {}).get(key):
                out.refused.append(f"ResourceFlavor {name}: {key} has no equivalent in a Chamber pool (ignored)")
    return pools


def _queues(queues: list[dict[str, Any]], pools: dict[str, str | None], out: Conversion) -> None:
    cohort_of_pool: dict[str, str | None] = {}
    for cq in sorted(queues, key=_name):
        team, spec = _name(cq), cq.get("spec") or {}
        where = f"ClusterQueue {team}"
        if not is_team(team):
            out.refused.append(f"{where}: {team!r} is not a team name (lower-case letters, digits, '-')")
            continue
        for key, why in (
            ("admissionChecks", "admission checks have no equivalent"),
            ("admissionChecksStrategy", "admission checks have no equivalent"),
            ("stopPolicy", "a stop policy has no equivalent (cancel the team's jobs instead)"),
        ):
            if spec.get(key):
                out.refused.append(f"{where}: {why}")
        if spec.get("queueingStrategy") == "StrictFIFO":
            out.refused.append(
                f"{where}: StrictFIFO has no equivalent: Chamber orders by priority, fair share and submit time and "
                "backfills"
            )
        preemption = spec.get("preemption") or {}
        if preemption.get("reclaimWithinCohort") == "Never":
            out.refused.append(f"{where}: reclaimWithinCohort Never: Chamber always reclaims lent GPUs for their owner")
        if preemption.get("borrowWithinCohort", {}).get("policy", "Never") != "Never":
            out.refused.append(f"{where}: borrowWithinCohort has no equivalent: Chamber never preempts to borrow")
        if spec.get("namespaceSelector") not in (None, {}):
            out.refused.append(
                f"{where}: namespaceSelector is replaced by the namespace bindings (LocalQueues below); not copied"
            )
        cohort = spec.get("cohort") or spec.get("cohortName")
        weight = (spec.get("fairSharing") or {}).get("weight")
        for group in spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                fname = str(flavor.get("name"))
                for resource in flavor.get("resources") or []:
                    rname = resource.get("name")
                    if rname != GPU_RESOURCE:
                        out.refused.append(
                            f"{where}: flavor {fname} quota of {rname} is not carried over: Chamber schedules GPUs"
                        )
                        continue
                    _quota(out, where, team, fname, resource, cohort, weight, pools, cohort_of_pool)


def _quota(
    out: Conversion,
    where: str,
    team: str,
    flavor: str,
    resource: dict[str, Any],
    cohort: str | None,
    weight: Any,
    pools: dict[str, str | None],
    cohort_of_pool: dict[str, str | None],
) -> None:
    if flavor not in pools:
        out.refused.append(f"{where}: ResourceFlavor {flavor} is not in the file, so its nodes are unknown")
        return
    pool = pools[flavor]
    if pool is None:
        return  # the flavor was refused already
    if cohort:
        previous = cohort_of_pool.setdefault(pool, cohort)
        if previous != cohort:
            out.refused.append(
                f"{where}: cohorts {previous} and {cohort} share flavor {flavor}: one Chamber pool would let them "
                "borrow from each other; give each cohort its own flavor (node label)"
            )
            return
    gpus = _whole(resource.get("nominalQuota"), f"{where} nominalQuota", out.refused)
    if gpus is None:
        return
    args = ["chamber", "quota", "set", team, "--pool", pool, "--gpus", str(gpus)]
    if cohort:
        borrow = _whole(resource.get("borrowingLimit"), f"{where} borrowingLimit", out.refused)
        lend = _whole(resource.get("lendingLimit"), f"{where} lendingLimit", out.refused)
    else:
        borrow, lend = 0, 0  # alone: neither borrows nor lends
    if borrow is not None:
        args += ["--borrow-limit", str(borrow)]
    if lend is not None:
        args += ["--lend-limit", str(lend)]
    if weight is not None:
        try:
            args += ["--weight", f"{float(str(weight)):g}"]
        except ValueError:
            out.refused.append(f"{where}: fairSharing.weight {weight!r} is not a number")
    args.append("--replace")  # the ClusterQueue is the whole quota: what it leaves out takes its default
    out.commands.append(" ".join(shlex.quote(a) for a in args))


def _local_queues(queues: list[dict[str, Any]], cluster_queues: set[str], out: Conversion) -> None:
    namespaces: dict[str, dict[str, Any]] = {}
    for lq in sorted(queues, key=lambda q: ((q.get("metadata") or {}).get("namespace") or "", _name(q))):
        ns = (lq.get("metadata") or {}).get("namespace")
        cq = (lq.get("spec") or {}).get("clusterQueue")
        if not ns or not cq:
            out.refused.append(f"LocalQueue {_name(lq)}: needs metadata.namespace and spec.clusterQueue")
            continue
        if cq not in cluster_queues:
            out.refused.append(f"LocalQueue {ns}/{_name(lq)}: ClusterQueue {cq} is not in the file")
            continue
        binding = namespaces.setdefault(ns, {"teams": [], "queues": {}})
        if cq not in binding["teams"]:
            binding["teams"].append(cq)
        binding["queues"][_name(lq)] = cq
    if namespaces:
        out.bindings["namespaces"] = namespaces


def _priorities(classes: list[dict[str, Any]], out: Conversion) -> None:
    valued = []
    for wpc in classes:
        try:
            valued.append((int(wpc["value"]), _name(wpc)))
        except (KeyError, TypeError, ValueError):
            out.refused.append(f"WorkloadPriorityClass {_name(wpc)}: value {wpc.get('value')!r} is not a whole number")
    if not valued:
        return
    ranked = sorted(valued, reverse=True)
    mapping = {}
    for i, (_, name) in enumerate(ranked):
        mapping[name] = "high" if i == 0 and len(ranked) > 1 else "low" if i == len(ranked) - 1 else "normal"
    out.bindings["priorities"] = mapping
