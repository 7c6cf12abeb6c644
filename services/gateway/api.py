"""The HTTP surface (aiohttp): JSON API under /api/, OpenAPI, /healthz, /metrics and the dashboard.

Reads answer from the in-memory read model. Commands are forwarded over NATS request/reply to the
service that owns them, behind a bearer token: the gateway never changes anything itself, so a
request it refuses (401, 4xx) cannot have changed anything either.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from events.commands import REQUESTS, CancelJob, PatchTeamQuota, RestoreNode, SetTeamQuota, SubmitJob
from events.names import InvalidName, decode_request, normalize_team
from services.gateway import fabric, metrics, openapi, views
from services.gateway.core import GatewayState, JobState
from services.gateway.history import HistoryView, TeamWindowCost
from services.gateway.openapi import Operation, Param
from services.runtime.commands import CommandRefused, CommandUnavailable
from services.runtime.logs import get_logger

# Forward one command: (service, verb, payload) -> the service's result. Raises CommandRefused or
# CommandUnavailable (services.runtime.commands.request, bound to the gateway's NATS connection).
Forward = Callable[[str, str, dict[str, Any]], Awaitable[Any]]
# The seam for history: given [since, until) (Unix seconds), the warehouse's series (efficiency, idle
# share, queue depth, cost by team; services/gateway/history.py asks the recorder), or None when the
# warehouse does not answer, and the live series from the read model is served instead.
HistorySource = Callable[[float, float], Awaitable[HistoryView | None]]

_encoder = msgspec.json.Encoder()
log = get_logger("chamber.gateway.api")
_STATIC = files("services.gateway") / "static"
_JOB_STATES = sorted(s.value for s in JobState)


@dataclass
class GatewayContext:
    state: GatewayState
    forward: Forward
    token: str | None
    stop: asyncio.Event
    history: HistorySource | None = None
    stream_interval_s: float = 2.0
    clock: Callable[[], float] = time.time
    ready: Callable[[], dict[str, Any]] = field(default=lambda: {})  # extra /healthz facts (stream positions)
    protect_reads: bool = False  # reads under /api/ and /metrics need the bearer token too
    # "replaying: folded N of M" while the read model is still folding the log (None: caught up);
    # /api/* answers 503 with Retry-After meanwhile rather than serve a half-folded fleet
    replaying: Callable[[], str | None] = field(default=lambda: None)
    _summary: tuple[float, bytes] | None = None

    def summary_body(self) -> bytes:
        """The encoded summary, shared by every dashboard for half a push interval: with many browsers
        open on a large fleet, building it once per push matters (see bench/gateway.py)."""
        now = self.clock()
        if self._summary is None or not 0 <= now - self._summary[0] < self.stream_interval_s / 2:
            self._summary = (now, _encoder.encode(views.summary(self.state, now)))
        return self._summary[1]


STATE = web.AppKey("gateway", GatewayContext)
REGISTRY = web.AppKey("registry", CollectorRegistry)
OPENAPI = web.AppKey("openapi", dict)


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(value), status=status, content_type="application/json")


# A refused command's HTTP status by what the client should do next (services/runtime/commands.py).
REFUSAL_STATUS = {"invalid": 422, "conflict": 409, "catching_up": 503, "unknown": 404}


def problem(status: int, error: str, field: str | None = None) -> web.Response:
    return json_response(views.Problem(error=error, field=field, status=status), status)


class BadRequest(Exception):
    def __init__(self, error: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(error)
        self.field = field
        self.status = status


# --- reads -----------------------------------------------------------------------------------------


def _ctx(request: web.Request) -> GatewayContext:
    return request.app[STATE]


def _flag(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise BadRequest(f"query parameter {name} must be true or false, not {raw!r}", name)


def _int(request: web.Request, name: str, default: int, *, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer, not {raw!r}", name) from None
    if not lo <= value <= hi:
        raise BadRequest(f"query parameter {name} must be between {lo} and {hi}, not {value}", name)
    return value


async def get_fleet(request: web.Request) -> web.Response:
    return json_response(views.fleet(_ctx(request).state, with_gpus=_flag(request, "gpus", True)))


async def get_node(request: web.Request) -> web.Response:
    state = _ctx(request).state
    node = state.nodes.get((request.match_info["cluster"], request.match_info["node"]))
    if node is None:
        raise BadRequest(
            f"no node {request.match_info['node']!r} in cluster {request.match_info['cluster']!r}", status=404
        )
    return json_response(views.node_view(state, node))


async def get_gpus(request: web.Request) -> web.Response:
    return json_response(views.gpus(_ctx(request).state))


async def get_queue(request: web.Request) -> web.Response:
    return json_response(views.queue(_ctx(request).state))


async def get_jobs(request: web.Request) -> web.Response:
    states: set[str] | None = None
    if "state" in request.query:
        states = {s for s in request.query["state"].split(",") if s}
        unknown = states - set(_JOB_STATES)
        if unknown:
            raise BadRequest(f"unknown job state {sorted(unknown)[0]!r}; one of {', '.join(_JOB_STATES)}", "state")
    limit = _int(request, "limit", 500, lo=1, hi=10_000)
    team = request.query.get("team")
    if team is not None:
        try:
            team = normalize_team(team)  # the one team rule: ?team=Vision finds vision's jobs
        except InvalidName as exc:
            raise BadRequest(str(exc), "team") from None
    return json_response(views.jobs(_ctx(request).state, states=states, team=team, limit=limit))


async def get_job(request: web.Request) -> web.Response:
    job = _ctx(request).state.jobs.get(request.match_info["job_id"])
    if job is None:
        raise BadRequest(f"no job {request.match_info['job_id']!r}", status=404)
    return json_response(views.job_view(job))


async def get_teams(request: web.Request) -> web.Response:
    return json_response(views.teams(_ctx(request).state))


SINCE_MAX = 4102444800.0  # 2100-01-01: beyond it no series has points (and dates overflow)


def _since(request: web.Request) -> float | None:
    if "since" not in request.query:
        return None
    raw = request.query["since"]
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"query parameter since must be Unix seconds, not {raw!r}", "since") from None
    if not math.isfinite(value) or not 0 <= value <= SINCE_MAX:
        raise BadRequest(f"query parameter since must be Unix seconds between 0 and {SINCE_MAX:.0f}", "since")
    return value


async def get_efficiency(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    view = views.efficiency(ctx.state, history=_flag(request, "history", True))
    since = _since(request)
    if since is not None:
        history = await ctx.history(since, ctx.clock()) if ctx.history is not None else None
        if history is not None:
            view.history = history.points
            view.source = "warehouse"
        else:
            view.history = [p for p in view.history if p.at >= since]
    return json_response(view)


async def get_history(request: web.Request) -> web.Response:
    """The warehouse's series over a window (default: the last hour); the live one if it does not answer."""
    ctx = _ctx(request)
    now = ctx.clock()
    since = _since(request)
    since = now - 3600 if since is None else since
    if since >= now:
        raise BadRequest("query parameter since must be in the past", "since")
    history = await ctx.history(since, now) if ctx.history is not None else None
    if history is not None:
        return json_response(history)
    # the live fallback: the gateway's own series, and cost totals so far (the read model keeps no
    # cost over time)
    live = [p for p in views.efficiency(ctx.state).history if p.at >= since]
    cost = views.cost(ctx.state)
    totals = [TeamWindowCost(team=t.team, cost=t.cost, gpu_hours=t.gpu_hours) for t in cost.by_team if t.cost]
    if cost.idle_cost:
        totals.append(TeamWindowCost(team="idle", cost=cost.idle_cost, gpu_hours=cost.idle_gpu_hours))
    return json_response(
        HistoryView(
            source="live",
            since=since,
            until=now,
            step_s=0,
            points=live,
            cost_by_team=sorted(totals, key=lambda t: (-t.cost, t.team)),
        )
    )


async def get_cost(request: web.Request) -> web.Response:
    return json_response(views.cost(_ctx(request).state))


async def get_faults(request: web.Request) -> web.Response:
    return json_response(views.faults(_ctx(request).state, limit=_int(request, "limit", 200, lo=1, hi=1000)))


async def get_summary(request: web.Request) -> web.Response:
    return web.Response(body=_ctx(request).summary_body(), content_type="application/json")


async def get_fabric(request: web.Request) -> web.Response:
    """The fabric panel: each node's latest NICs with flags, and the jobs' slowdown episodes."""
    body = _encoder.encode(fabric.answer(_ctx(request).state.fabric))
    return web.Response(body=body, content_type="application/json")


async def get_job_ranks(request: web.Request) -> web.Response:
    """Read-only: the perf service's job view (no token: it changes nothing)."""
    return await _forward(request, "perf", "ranks", {"job": request.match_info["job_id"]})


async def get_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the summary now, then every `stream_interval_s`, until the client leaves."""
    ctx = _ctx(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
        while not ctx.stop.is_set():
            await response.write(b"event: summary\ndata: " + ctx.summary_body() + b"\n\n")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stop.wait(), timeout=ctx.stream_interval_s)
    return response


async def healthz(request: web.Request) -> web.Response:
    """503 while the bus is down: the numbers served are frozen then, and commands cannot be sent."""
    ctx = _ctx(request)
    facts = ctx.ready()
    ok = facts.get("nats_connected") is not False
    body = {"ok": ok, "events_seen": ctx.state.events_seen, "replaying": ctx.replaying(), **facts}
    return json_response(body, 200 if ok else 503)


async def get_metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def get_openapi(request: web.Request) -> web.Response:
    return json_response(request.app[OPENAPI])


async def index(request: web.Request) -> web.Response:
    return web.Response(body=(_STATIC / "index.html").read_bytes(), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kinds = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    kind = next((v for k, v in kinds.items() if name.endswith(k)), None)
    resource = _STATIC / name
    if kind is None or "/" in name or not resource.is_file():
        raise web.HTTPNotFound()
    return web.Response(body=resource.read_bytes(), content_type=kind, charset="utf-8")


# --- commands --------------------------------------------------------------------------------------


def unauthorized(error: str) -> web.Response:
    response = problem(401, error)
    response.headers["WWW-Authenticate"] = 'Bearer realm="chamber"'
    return response


def _authorize(request: web.Request) -> web.Response | None:
    token = _ctx(request).token
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if not token:
        return unauthorized("commands are disabled: start the gateway with --token or CHAMBER_API_TOKEN")
    if scheme.lower() != "bearer" or not given:
        return unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return unauthorized("wrong bearer token")
    return None


MAX_JSON_DEPTH = 32  # a command body is a flat object with a few lists: far less than this


def _no_constant(name: str) -> float:
    """JSON has no NaN or Infinity (Python's parser accepts them): a number must be finite."""
    raise ValueError(f"{name} is not a number JSON allows")


def _nesting(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw`, brackets inside strings not counted (the
    parser would recurse that deep before anything could refuse it)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


async def _body(request: web.Request, *, required: bool) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise BadRequest("a JSON object body is required")
        return {}
    if _nesting(raw) > MAX_JSON_DEPTH:
        raise BadRequest(f"body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"body must be a JSON object, not {type(value).__name__}")
    return value


def _pin(body: dict[str, Any], **path: Any) -> dict[str, Any]:
    """Path parameters win; a body that names a different value is a mistake worth saying."""
    for name, value in path.items():
        if name in body and body[name] != value:  # null or another type is as wrong as another value
            raise BadRequest(f"{name} in the body ({body[name]!r}) differs from the path ({value!r})", name)
    return {**body, **path}


def _checked(service: str, verb: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The body as the owning service will decode it (events/commands.py): refused here, naming the
    field, with the same words the service would use; what goes on is the normalised request."""
    try:
        req = decode_request(payload, REQUESTS[service][verb])
    except InvalidName as exc:
        raise BadRequest(str(exc), exc.field, status=422) from None
    checked: dict[str, Any] = msgspec.to_builtins(req)
    return {k: checked[k] for k in payload}  # the fields sent, normalised; the service applies its defaults


async def _forward(request: web.Request, service: str, verb: str, payload: dict[str, Any]) -> web.Response:
    payload = _checked(service, verb, payload)
    try:
        result = await _ctx(request).forward(service, verb, payload)
    except CommandRefused as exc:
        response = problem(REFUSAL_STATUS[exc.kind], str(exc), exc.field)
        if exc.kind == "catching_up":
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    except CommandUnavailable as exc:
        return problem(503, str(exc))
    return json_response(views.CommandAnswer(ok=True, result=result))


def _command(
    handler: Callable[[web.Request], Awaitable[web.Response]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def guarded(request: web.Request) -> web.Response:
        denied = _authorize(request)
        return denied if denied is not None else await handler(request)

    return guarded


@_command
async def submit_job(request: web.Request) -> web.Response:
    """`Idempotency-Key` (or `request_id` in the body): a retried submit is applied once."""
    body = await _body(request, required=True)
    key = request.headers.get("Idempotency-Key", "").strip()
    if key and "request_id" not in body:
        body["request_id"] = key
    return await _forward(request, "scheduler", "submit", body)


@_command
async def cancel_job(request: web.Request) -> web.Response:
    payload = _pin(await _body(request, required=False), job_id=request.match_info["job_id"])
    return await _forward(request, "scheduler", "cancel", payload)


@_command
async def set_quota(request: web.Request) -> web.Response:
    payload = _pin(await _body(request, required=True), team=request.match_info["team"])
    return await _forward(request, "quota", "set", payload)


@_command
async def patch_quota(request: web.Request) -> web.Response:
    payload = _pin(await _body(request, required=True), team=request.match_info["team"])
    return await _forward(request, "quota", "patch", payload)


@_command
async def restore_node(request: web.Request) -> web.Response:
    m = request.match_info
    payload = _pin(await _body(request, required=False), cluster=m["cluster"], node=m["node"])
    return await _forward(request, "health", "restore", payload)


# --- the route table (also the OpenAPI document) ----------------------------------------------------

_CLUSTER_NODE = (
    Param("cluster", "path", {"type": "string"}),
    Param("node", "path", {"type": "string"}),
)
_BOOL = {"type": "boolean"}
_SINCE = {"type": "number", "minimum": 0, "maximum": SINCE_MAX}

ROUTES: list[tuple[Operation, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
    (
        Operation(
            "GET",
            "/api/fleet",
            "getFleet",
            "Nodes, their GPUs and status",
            views.FleetView,
            params=(Param("gpus", "query", _BOOL, "include each node's GPUs (default true)"),),
        ),
        get_fleet,
    ),
    (
        Operation(
            "GET",
            "/api/nodes/{cluster}/{node}",
            "getNode",
            "One node",
            views.NodeView,
            params=_CLUSTER_NODE,
            errors=(404,),
        ),
        get_node,
    ),
    (Operation("GET", "/api/gpus", "getGpus", "Every GPU: utilization, health, job", list[views.GpuView]), get_gpus),
    (
        Operation("GET", "/api/queue", "getQueue", "Waiting jobs in order, with why they wait", views.QueueView),
        get_queue,
    ),
    (
        Operation(
            "GET",
            "/api/jobs",
            "getJobs",
            "Jobs, newest activity first",
            views.JobsView,
            params=(
                Param("state", "query", {"type": "string"}, f"comma-separated: {', '.join(_JOB_STATES)}"),
                Param("team", "query", {"type": "string"}),
                Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10000}),
            ),
        ),
        get_jobs,
    ),
    (
        Operation(
            "GET",
            "/api/jobs/{job_id}",
            "getJob",
            "One job",
            views.JobView,
            params=(Param("job_id", "path", {"type": "string"}),),
            errors=(404,),
        ),
        get_job,
    ),
    (
        Operation("GET", "/api/teams", "getTeams", "Teams: quota, usage, borrowed share, cost", views.TeamsView),
        get_teams,
    ),
    (
        Operation(
            "GET",
            "/api/efficiency",
            "getEfficiency",
            "Allocation, usage, efficiency score and idle share",
            views.EfficiencyView,
            params=(
                Param("history", "query", _BOOL, "include the series (default true)"),
                Param("since", "query", _SINCE, "series from this Unix time"),
            ),
        ),
        get_efficiency,
    ),
    (
        Operation(
            "GET",
            "/api/history",
            "getHistory",
            "Efficiency, idle share, queue depth and cost by team over time, from the warehouse",
            HistoryView,
            params=(Param("since", "query", _SINCE, "from this Unix time (default: an hour ago)"),),
        ),
        get_history,
    ),
    (Operation("GET", "/api/cost", "getCost", "Cost by team, idle cost, prices", views.CostView), get_cost),
    (
        Operation(
            "GET",
            "/api/faults",
            "getFaults",
            "Active isolations and the faults timeline",
            views.FaultsView,
            params=(Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000}),),
        ),
        get_faults,
    ),
    (Operation("GET", "/api/summary", "getSummary", "Everything the dashboard shows", views.Summary), get_summary),
    (Operation("GET", "/api/fabric", "getFabric", "NICs per node and job slowdowns", fabric.FabricAnswer), get_fabric),
    (
        Operation(
            "GET",
            "/api/jobs/{job_id}/ranks",
            "getJobRanks",
            "A running job's per-rank GPU activity over time and its slowdown culprit (from the perf service)",
            views.CommandAnswer,
            params=(Param("job_id", "path", {"type": "string"}),),
            errors=(422, 503),
        ),
        get_job_ranks,
    ),
    (
        Operation(
            "GET",
            "/api/stream",
            "streamSummary",
            "Server-sent events: the summary, every few seconds",
            content_type="text/event-stream",
        ),
        get_stream,
    ),
    (
        Operation(
            "POST",
            "/api/jobs",
            "submitJob",
            "Submit a job",
            views.CommandAnswer,
            command="scheduler.submit",
            body=True,
            request=SubmitJob,
            description="The team must have a quota (0 is allowed). A job that can never run on the fleet as "
            "installed (no GPU of its model, larger than its pool or than its team may hold) is refused (422) "
            "unless `allow_wait` is true; then it is accepted with `warnings` in the result.",
        ),
        submit_job,
    ),
    (
        Operation(
            "POST",
            "/api/jobs/{job_id}/cancel",
            "cancelJob",
            "Cancel a job",
            views.CommandAnswer,
            command="scheduler.cancel",
            params=(Param("job_id", "path", {"type": "string"}),),
            request=CancelJob,
        ),
        cancel_job,
    ),
    (
        Operation(
            "PUT",
            "/api/teams/{team}/quota",
            "setQuota",
            "Set (replace) a team's quota in a pool",
            views.CommandAnswer,
            command="quota.set",
            params=(Param("team", "path", {"type": "string"}),),
            body=True,
            request=SetTeamQuota,
            description="PUT replaces the whole quota of the team in the pool: a field left out takes its default "
            "(no borrow limit, no lend limit, weight 1), it does not keep its old value; PATCH changes only the "
            "fields sent. `team` in the body is optional and must match the path. The result lists every setting "
            "before and after (`changes`) and `warnings`, e.g. when the pool's guarantees exceed its installed GPUs.",
        ),
        set_quota,
    ),
    (
        Operation(
            "PATCH",
            "/api/teams/{team}/quota",
            "patchQuota",
            "Change some settings of a team's quota in a pool",
            views.CommandAnswer,
            command="quota.patch",
            params=(Param("team", "path", {"type": "string"}),),
            body=True,
            request=PatchTeamQuota,
            description="Only the fields sent change; the others keep their current values (a team's first quota "
            "in the pool needs `gpus`). `null` clears a limit. `team` in the body is optional and must match the "
            "path.",
        ),
        patch_quota,
    ),
    (
        Operation(
            "POST",
            "/api/nodes/{cluster}/{node}/restore",
            "restoreNode",
            "Restore an isolated node or GPU",
            views.CommandAnswer,
            command="health.restore",
            params=_CLUSTER_NODE,
            request=RestoreNode,
        ),
        restore_node,
    ),
    (Operation("GET", "/healthz", "healthz", "Liveness, and how much of each stream is folded"), healthz),
    (Operation("GET", "/metrics", "metrics", "Prometheus metrics (chamber_*)", content_type="text/plain"), get_metrics),
    (Operation("GET", "/openapi.json", "openapi", "This document"), get_openapi),
]


@web.middleware
async def json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """Every error under /api/ (and the JSON endpoints) answers JSON naming the problem."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return problem(exc.status, str(exc), exc.field)
    except web.HTTPException as exc:
        if exc.status < 400 or not (request.path.startswith("/api/") or request.path in ("/healthz", "/openapi.json")):
            raise
        text = {404: f"no route {request.path}", 405: f"{request.method} is not allowed on {request.path}"}
        response = problem(exc.status, text.get(exc.status, exc.reason))
        if isinstance(exc, web.HTTPMethodNotAllowed):
            response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return response
    except Exception as exc:  # a bug answers JSON too, and is logged; the server keeps serving
        log.exception("request failed", method=request.method, path=request.path)
        return problem(500, f"internal error: {type(exc).__name__}: {exc}")


# The dashboard uses inline style attributes (bars, swatches), never inline scripts.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate CSP 2
    "Referrer-Policy": "no-referrer",
}


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def _is_read(request: web.Request) -> bool:
    return request.method in ("GET", "HEAD") and (request.path.startswith("/api/") or request.path == "/metrics")


@web.middleware
async def read_auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """With `protect_reads`, reads need the bearer token as commands do (/healthz, the dashboard's page
    and /openapi.json stay open: the page asks for the token, probes and tools need the others)."""
    if _ctx(request).protect_reads and _is_read(request):
        denied = _authorize(request)
        if denied is not None:
            return denied
    return await handler(request)


RETRY_AFTER_S = 5  # what a client told "catching up" waits before asking again


@web.middleware
async def catching_up(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """While the read model is still folding the log, /api/* answers 503 and Retry-After: its numbers
    would be a half-built fleet. /healthz says why ("replaying"), /metrics has `chamber_replaying`."""
    if request.path.startswith("/api/"):
        replaying = _ctx(request).replaying()
        if replaying:
            response = problem(503, f"catching up ({replaying}); try again in {RETRY_AFTER_S} s")
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            return response
    return await handler(request)


def make_app(ctx: GatewayContext) -> web.Application:
    app = web.Application(middlewares=[json_errors, read_auth, catching_up], client_max_size=1024 * 1024)
    app.on_response_prepare.append(_security_headers)
    app[STATE] = ctx
    app[REGISTRY] = metrics.registry_for(lambda: ctx.state, replaying=ctx.replaying)
    app[OPENAPI] = openapi.build(
        [op for op, _ in ROUTES], title="Chamber gateway", version=_version(), protect_reads=ctx.protect_reads
    )
    for op, handler in ROUTES:
        app.router.add_route(op.method, op.path, handler)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chamber")
    except PackageNotFoundError:
        return "0"
