"""The admission webhook's decisions, pure: AdmissionReview in, AdmissionReview out.

- mutate: a workload that names a team (`chamber.io/team`) or a Kueue queue is created held:
  suspended (Job, JobSet, TrainJob, PyTorchJob, MPIJob, RayJob) or with the scheduling gate
  `chamber.io/admission` (Pod), so it can never run outside Chamber's quotas. A team label in upper
  case is folded to lower case (label values allow it, team names do not).
- validate: refuses a team the namespace may not charge, an unknown priority, a kind Chamber does not
  manage, and GPU counts that are zero, not whole, or absurd; each message names the fix. On UPDATE
  only a change of those labels is checked, so Chamber's own patches (suspend, placement) and
  objects created before a binding changed are never blocked.

Children of a managed workload (a JobSet's Jobs, a Job's Pods) belong to their owner's admission
and pass untouched; Pods of a Deployment or StatefulSet that name a team are gated one by one.
A body that is not an AdmissionReview gets a 400 with the reason; nothing here
raises, so the server never answers 500 to the API server.
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from services.kube.bindings import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, PRIORITY_LABEL, TEAM_LABEL, Bindings
from services.kube.bindings import claim as claim_of
from services.kube.kinds import KINDS, WorkloadKind, kind_for, owned_by_workload
from services.kube.patches import Op, escape
from services.kube.resources import WorkloadError

ADMISSION_VERSION = "admission.k8s.io/v1"
MAX_BODY = 3 * 1024 * 1024  # the API server caps objects near 1.5 MiB; a review holds two of them
CHECKED_LABELS = (TEAM_LABEL, KUEUE_QUEUE_LABEL, PRIORITY_LABEL, KUEUE_PRIORITY_LABEL)


class BadReview(ValueError):
    """Not an AdmissionReview: answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    namespace: str
    group: str
    kind: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


def parse(body: bytes) -> Request:
    if len(body) > MAX_BODY:
        raise BadReview(f"body of {len(body)} bytes is larger than {MAX_BODY}")
    try:
        review = json.loads(body)
    except ValueError as exc:
        raise BadReview(f"not JSON: {exc}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("expected an AdmissionReview object (kind: AdmissionReview)")
    if review.get("apiVersion") != ADMISSION_VERSION:
        raise BadReview(f"apiVersion {review.get('apiVersion')!r} is not supported: configure {ADMISSION_VERSION}")
    req = review.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise BadReview("request.uid is missing")
    kind = req.get("kind")
    obj = req.get("object")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise BadReview("request.kind is missing")
    if req.get("operation") in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise BadReview("request.object is missing")
    old = req.get("oldObject")
    for field, value in (("object", obj), ("oldObject", old)):
        if isinstance(value, dict) and not isinstance(value.get("metadata", {}), dict):
            raise BadReview(f"request.{field}.metadata is not an object")
    return Request(
        uid=req["uid"],
        operation=str(req.get("operation") or ""),
        namespace=str(req.get("namespace") or ((obj or {}).get("metadata") or {}).get("namespace") or ""),
        group=str(kind.get("group") or ""),
        kind=kind["kind"],
        obj=obj if isinstance(obj, dict) else {},
        old=old if isinstance(old, dict) else None,
    )


def _labels(obj: dict[str, Any] | None) -> dict[str, str]:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _answer(uid: str, allowed: bool, message: str = "", ops: list[Op] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": f"Chamber: {message}"}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": response}


def _ours(req: Request) -> bool:
    labels = _labels(req.obj)
    return (TEAM_LABEL in labels or KUEUE_QUEUE_LABEL in labels) and not owned_by_workload(req.obj)


def mutate(req: Request) -> dict[str, Any]:
    kind = kind_for(req.group, req.kind)
    if req.operation != "CREATE" or kind is None or not _ours(req):
        return _answer(req.uid, True)
    ops: list[Op] = []
    team = _labels(req.obj).get(TEAM_LABEL)
    if team is not None and team != team.strip().lower():
        ops.append({"op": "replace", "path": f"/metadata/labels/{escape(TEAM_LABEL)}", "value": team.strip().lower()})
    with contextlib.suppress(WorkloadError, TypeError, AttributeError):  # malformed: validate says why
        ops += kind.hold_ops(req.obj)
    return _answer(req.uid, True, ops=ops)


def refusal(req: Request, kind: WorkloadKind | None, bindings: Bindings) -> str | None:
    """Why this workload may not be created (or relabeled) as it is; None if it may."""
    if kind is None:
        managed = ", ".join(sorted({f"{k.kind} ({k.api_version})" for k in KINDS}))
        return (
            f"Chamber does not manage {req.kind} objects; it manages {managed}. Remove the {TEAM_LABEL} / "
            f"{KUEUE_QUEUE_LABEL} label, or submit the work as one of those kinds"
        )
    claimed = claim_of(_labels(req.obj), req.namespace, bindings)
    if isinstance(claimed, str):
        return claimed
    try:
        demand = kind.demand(req.obj)
    except WorkloadError as exc:
        return str(exc)
    except (TypeError, AttributeError, KeyError) as exc:
        return f"the {req.kind} is malformed where Chamber reads it ({type(exc).__name__}: {exc})"
    if (why := kind.check(req.obj)) is not None:
        return why
    if demand is None:
        return (
            f"the {req.kind} asks for no nvidia.com/gpu (nor amd.com/gpu); Chamber schedules GPU work: set "
            "nvidia.com/gpu (or amd.com/gpu) limits on "
            f"its containers, or remove the {TEAM_LABEL} / {KUEUE_QUEUE_LABEL} label"
        )
    return None


def validate(req: Request, bindings: Bindings) -> dict[str, Any]:
    if req.operation not in ("CREATE", "UPDATE") or not _ours(req):
        return _answer(req.uid, True)
    if req.operation == "UPDATE":
        before = {k: v for k, v in _labels(req.old).items() if k in CHECKED_LABELS}
        after = {k: v for k, v in _labels(req.obj).items() if k in CHECKED_LABELS}
        if before == after:
            return _answer(req.uid, True)
    why = refusal(req, kind_for(req.group, req.kind), bindings)
    return _answer(req.uid, why is None, why or "")
