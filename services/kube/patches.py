"""JSON Patch (RFC 6902) building blocks and the node-affinity merge Chamber uses to place pods.

Every change Chamber makes to a workload is a JSON Patch: it names exact paths (one pod template in
a list of many), works for built-in kinds and custom resources alike, and is what an admission
webhook must answer with anyway.
"""

from __future__ import annotations

import copy
import json
from typing import Any

HOSTNAME_LABEL = "kubernetes.io/hostname"
USER_AFFINITY_ANNOTATION = "chamber.io/user-affinity"  # the user's own affinity, kept while Chamber pins

Op = dict[str, Any]


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def resolve(obj: Any, pointer: str) -> Any:
    """The value at a JSON pointer, or None when any step is missing."""
    node = obj
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(token)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
        if node is None:
            return None
    return node


def set_value(obj: dict[str, Any], pointer: str, value: Any) -> list[Op]:
    """Ops that set `pointer` to `value`, creating missing parent objects (JSON Patch `add` needs them)."""
    tokens = pointer.split("/")[1:]
    for depth in range(1, len(tokens)):
        parent = "/" + "/".join(tokens[:depth])
        if not isinstance(resolve(obj, parent), dict):
            nested: Any = value
            for token in reversed(tokens[depth:]):
                nested = {token.replace("~1", "/").replace("~0", "~"): nested}
            return [{"op": "add", "path": parent, "value": nested}]
    return [{"op": "add", "path": pointer, "value": value}]


def annotation_ops(obj: dict[str, Any], key: str, value: str | None) -> list[Op]:
    """Set (or, with None, remove) one annotation."""
    annotations = (obj.get("metadata") or {}).get("annotations")
    path = f"/metadata/annotations/{escape(key)}"
    if value is None:
        return [{"op": "remove", "path": path}] if annotations and key in annotations else []
    if annotations is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {key: value}}]
    return [{"op": "add", "path": path, "value": value}]


def saved_affinities(obj: dict[str, Any]) -> dict[str, Any] | None:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(USER_AFFINITY_ANNOTATION)
    if raw is None:
        return None
    try:
        saved = json.loads(raw)
    except ValueError:
        return None
    return saved if isinstance(saved, dict) else None


def pinned(user_affinity: dict[str, Any] | None, nodes: tuple[str, ...]) -> dict[str, Any]:
    """The user's affinity with the chosen nodes added to every required term.

    Terms are ORed and a term's expressions ANDed, so adding `hostname In nodes` to each term keeps
    every constraint the user wrote (GPU product, zone...) and narrows it to Chamber's nodes. It is
    also the one change Kubernetes allows on a gated Pod (additions to matchExpressions).
    """
    affinity = copy.deepcopy(user_affinity) if user_affinity else {}
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    expression = {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(nodes)}
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
        **required,
        "nodeSelectorTerms": [
            {**t, "matchExpressions": [*(t.get("matchExpressions") or []), expression]} for t in terms
        ],
    }
    return affinity
