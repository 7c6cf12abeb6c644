// Chamber dashboard: one summary document pushed by /api/stream (server-sent events), drawn with
// plain DOM and SVG. No external libraries, so it works with no internet.
"use strict";

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const pct = (x) => (x == null ? "–" : `${(x * 100).toFixed(1)} %`);
const plural = (n, word) => `${int(n)} ${word}${n === 1 ? "" : "s"}`;
const COMPACT_NODES = 64; // beyond this, smaller cells without numbers keep the whole fleet in view
const HELD_IDLE_PCT = 5; // the gateway's BUSY_THRESHOLD_PCT: held by a job, doing nothing
const int = (x) => (x == null ? "–" : Number(x).toLocaleString("en-US"));

// When the gateway protects reads (--protect-reads; on in the Helm chart), open the dashboard as
// /#token=<API token>: the token is kept for this tab only and sent as a bearer token. EventSource
// cannot send headers, so the dashboard then polls.
const TOKEN = (() => {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) { sessionStorage.setItem("chamber-token", decodeURIComponent(m[1])); history.replaceState(null, "", location.pathname); }
  return sessionStorage.getItem("chamber-token");
})();
const api = (url) => fetch(url, TOKEN ? { headers: { Authorization: `Bearer ${TOKEN}` } } : {});

function money(x, currency) {
  if (x == null) return "–";
  const sym = currency === "USD" ? "$" : currency === "EUR" ? "€" : "";
  const digits = Math.abs(x) >= 1000 ? 0 : 2;
  const v = Number(x).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  return sym ? `${sym}${v}` : `${v} ${currency}`;
}

function ago(seconds) {
  if (seconds == null || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function clock(t) {
  const d = new Date(t * 1000);
  return d.toLocaleTimeString("en-GB", { hour12: false });
}

// utilization 0..100 -> colour along the legend's three stops
function utilColor(u) {
  const stops = [[0, [29, 42, 74]], [50, [31, 138, 138]], [100, [74, 222, 128]]];
  const x = Math.min(100, Math.max(0, u ?? 0));
  for (let i = 1; i < stops.length; i++) {
    const [x1, c1] = stops[i];
    const [x0, c0] = stops[i - 1];
    if (x <= x1) {
      const f = (x - x0) / (x1 - x0);
      const c = c0.map((v, k) => Math.round(v + (c1[k] - v) * f));
      return `rgb(${c[0]},${c[1]},${c[2]})`;
    }
  }
  return "rgb(74,222,128)";
}

function renderCards(s) {
  const f = s.fleet, e = s.efficiency, q = s.queue, c = s.cost;
  $("gpus-total").textContent = int(f.gpus_total);
  $("nodes-total").textContent = plural(f.nodes_total, "node");
  $("gpus-allocated").textContent = int(f.gpus_allocated);
  $("allocation-ratio").textContent = `${pct(e.allocation_ratio)} of ${int(f.gpus_in_service)} usable`;
  $("gpus-idle").textContent = int(f.gpus_idle);
  $("idle-ratio").textContent = `${pct(e.idle_ratio)} · ${int(e.allocated_idle)} held idle`;
  $("gpus-isolated").textContent = int(f.gpus_isolated);
  const held = (s.faults.held || []).length;  // isolations the isolation budget held back
  $("gpus-isolated").closest(".card").classList.toggle("warn", f.gpus_isolated > 0 || held > 0);
  // held first: what waits for an operator must not be the part a narrow card cuts off
  $("nodes-isolated").textContent = (held ? `${held} held · ` : "") + `${plural(f.nodes_isolated, "node")} isolated`;
  $("efficiency-score").textContent = pct(e.efficiency_score);
  $("usage-ratio").textContent = `usage ${pct(e.usage_ratio)}`;
  $("queue-depth").textContent = int(q.depth);
  $("queue-gpus").textContent = `${int(q.gpus_requested)} GPUs requested`;
  $("running-count").textContent = int(s.running.count);
  $("teams-count").textContent = plural(s.teams.teams.length, "team");
  $("cost-total").textContent = money(c.total, c.currency);
  $("cost-rate").textContent = `${money(c.rate_per_hour, c.currency)}/h now`;
}

function renderHeatmap(fleet) {
  const html = fleet.nodes.map((n) => {
    const lost = n.status === "lost" || n.status === "no_agent";
    const cells = n.gpus.map((g) => {
      const health = g.health;
      let cls = "cell", style = "", label = g.utilization_pct == null ? "" : Math.round(g.utilization_pct);
      if (health === "isolated" || health === "node_isolated") { cls += " isolated"; label = ""; }
      else if (lost || health === "lost" || health === "no_agent") { cls += " lost"; label = ""; }
      else {
        style = `background:${utilColor(g.utilization_pct)}`;
        if (!g.job_id) cls += " free";
        else if (g.utilization_pct != null && g.utilization_pct < HELD_IDLE_PCT) cls += " held-idle";
      }
      const tip = [
        `${n.node} GPU ${g.index} · ${g.vendor === "amd" ? "AMD" : "NVIDIA"} ${g.model}`,
        `health: ${health}`,
        g.utilization_pct == null ? "utilization: unknown" : `utilization: ${g.utilization_pct.toFixed(0)} %`,
        g.temperature_c == null ? "" : `temperature: ${g.temperature_c.toFixed(0)} °C`,
        g.job_id ? `job: ${g.job_id} (${g.team})` : "free",
        g.isolation ? `isolated: ${g.isolation.reason}` : "",
      ].filter(Boolean).join("\n");
      return `<div class="${cls}" style="${style}" title="${esc(tip)}">${label}</div>`;
    }).join("");
    const sub = n.isolated ? `isolated: ${n.isolation?.reason ?? ""}` : n.status === "healthy" ? `${n.gpus_allocated}/${n.gpus_total} in use` : n.status;
    const vendors = [...new Set(n.gpus.map((g) => g.vendor === "amd" ? "AMD" : "NVIDIA"))].join("+");
    const vendor = vendors ? `<span class="vendor ${vendors === "AMD" ? "amd" : "nvidia"}">${esc(vendors)}</span>` : "";
    return `<div class="node ${esc(n.status)}${n.isolated ? " isolated" : ""}" data-node="${esc(n.node)}">
      <div class="name" title="${esc(n.cluster + "/" + n.node)}">${esc(n.node)} ${vendor}<small>${esc(sub)}</small></div>
      <div class="cells">${cells}</div></div>`;
  }).join("");
  $("heatmap").innerHTML = html || `<div class="muted">No nodes reported yet.</div>`;
  $("heatmap").classList.toggle("compact", fleet.nodes.length > COMPACT_NODES);
}

// a small line chart in SVG: series = [{values:[..], color}], y in [0, yMax]
function lineChart(svg, times, series, { yMax = 1, format = (v) => `${Math.round(v * 100)} %`, ticks = [0, 0.5, 1] } = {}) {
  // drawn in the element's own pixels, so text is never stretched
  const W = Math.max(300, Math.round(svg.clientWidth || 600)), H = 200, L = 44, R = 10, T = 10, B = 22;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const n = times.length;
  const x = (i) => L + (n <= 1 ? 0 : (i / (n - 1)) * (W - L - R));
  const y = (v) => T + (1 - Math.min(v, yMax) / yMax) * (H - T - B);
  let out = "";
  for (const t of ticks) {
    out += `<line class="grid-line" x1="${L}" x2="${W - R}" y1="${y(t)}" y2="${y(t)}"/>`;
    out += `<text x="${L - 6}" y="${y(t) + 4}" text-anchor="end">${esc(format(t))}</text>`;
  }
  if (n > 0) {
    out += `<text x="${L}" y="${H - 4}">${esc(clock(times[0]))}</text>`;
    out += `<text x="${W - R}" y="${H - 4}" text-anchor="end">${esc(clock(times[n - 1]))}</text>`;
  }
  for (const s of series) {
    if (!n) break;
    const pts = s.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    if (s.area) out += `<polygon fill="${s.color}" fill-opacity="0.12" points="${x(0)},${y(0)} ${pts} ${x(n - 1)},${y(0)}"/>`;
    out += `<polyline fill="none" stroke="${s.color}" stroke-width="2" stroke-linejoin="round" points="${pts}"/>`;
  }
  if (!n) out += `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">collecting…</text>`;
  svg.innerHTML = out;
}

// The warehouse's series (per minute, the last hour) once it has a few whole minutes; the live one
// (every few seconds, since the gateway started) until then or when the recorder does not answer.
let warehouse = null;
const HISTORY_WINDOW_S = 3600, HISTORY_REFRESH_MS = 30000, MIN_WAREHOUSE_POINTS = 3;

function useWarehouse() {
  return warehouse != null && warehouse.source === "warehouse" && warehouse.points.length >= MIN_WAREHOUSE_POINTS;
}

function fetchHistory() {
  api(`/api/history?since=${Date.now() / 1000 - HISTORY_WINDOW_S}`).then((r) => (r.ok ? r.json() : null))
    .then((h) => { warehouse = h; if (last) { renderCharts(last.efficiency); renderCostChart(last.cost); } })
    .catch(() => { warehouse = null; })
    .finally(() => setTimeout(fetchHistory, HISTORY_REFRESH_MS));
}

function renderCharts(e) {
  const fromWarehouse = useWarehouse();
  const h = fromWarehouse ? warehouse.points : e.history;
  $("efficiency-source").textContent = fromWarehouse ? `warehouse · last hour, per ${warehouse.step_s / 60} min` : "live";
  const times = h.map((p) => p.at);
  const css = getComputedStyle(document.documentElement);
  const color = (v) => css.getPropertyValue(v).trim();
  lineChart($("chart-efficiency"), times, [
    { values: h.map((p) => (p.capacity ? p.allocated / p.capacity : 0)), color: color("--blue") },
    { values: h.map((p) => p.idle_ratio), color: color("--amber") },
    { values: h.map((p) => p.efficiency_score), color: color("--good"), area: true },
  ]);
  const maxQ = Math.max(4, ...h.map((p) => p.queue_depth));
  const top = Math.ceil(maxQ / 4) * 4;
  lineChart($("chart-queue"), times, [{ values: h.map((p) => p.queue_depth), color: color("--violet"), area: true }], {
    yMax: top, format: (v) => String(Math.round(v)), ticks: [0, top / 2, top],
  });
}

function renderTeams(teams) {
  const max = Math.max(1, ...teams.map((t) => Math.max(t.used_gpus, t.guaranteed_gpus)));
  $("teams").innerHTML = teams.map((t) => {
    const own = Math.min(t.used_gpus, t.guaranteed_gpus), borrowed = t.borrowed_gpus;
    const w = (v) => `${(v / max) * 100}%`;
    const fs = t.fair_share == null ? "" : ` · fair share ${t.fair_share.toFixed(2)}`;
    return `<div class="bar-row" data-team="${esc(t.team)}">
      <div class="who">${esc(t.team)}</div>
      <div class="track" title="${esc(`${t.used_gpus} in use, ${t.guaranteed_gpus} guaranteed, ${borrowed} borrowed, ${t.pending_jobs} waiting`)}">
        <div class="fill own" style="width:${w(own)}"></div>
        <div class="fill borrowed" style="left:${w(own)};width:${w(borrowed)}"></div>
        ${t.guaranteed_gpus ? `<div class="marker" style="left:calc(${w(t.guaranteed_gpus)} - 1px)"></div>` : ""}
      </div>
      <div class="nums">${t.used_gpus} / ${t.guaranteed_gpus} GPUs${borrowed ? ` · +${borrowed} borrowed` : ""}<br>${t.running_jobs} running · ${t.pending_jobs} waiting${fs}</div>
    </div>`;
  }).join("") + `<div class="legend"><span><i class="sw" style="background:var(--blue)"></i>within guarantee</span><span><i class="sw" style="background:var(--violet)"></i>borrowed</span><span><i class="line" style="background:var(--text);width:2px;height:12px"></i>guarantee</span></div>`;
  if (!teams.length) $("teams").innerHTML = `<div class="muted">No teams yet.</div>`;
}

function renderCost(c) {
  $("cost-currency").textContent = `${c.currency} · total ${money(c.total, c.currency)} · idle ${money(c.idle_cost, c.currency)}`;
  const rows = c.by_team.map((t) => ({ who: t.team, cost: t.cost, note: `${money(t.rate_per_hour, c.currency)}/h · ${t.gpu_hours.toFixed(1)} GPU-h${t.budget == null ? "" : ` · budget ${money(t.budget, c.currency)}`}`, cls: "cost", over: t.budget_exceeded }));
  const places = c.idle_by_place || [];  // hybrid fleets: where the idle money goes
  if (places.length > 1) places.forEach((p) => rows.push({ who: `idle: ${[p.provider, p.region, p.cluster].filter(Boolean).join(" ")}`, cost: p.idle_cost, note: "healthy GPUs no job held", cls: "idle" }));
  else if (c.idle_cost > 0) rows.push({ who: "idle", cost: c.idle_cost, note: `${c.idle_gpu_hours.toFixed(1)} GPU-h unused`, cls: "idle" });
  const max = Math.max(1e-9, ...rows.map((r) => r.cost));
  $("cost").innerHTML = rows.map((r) => `<div class="bar-row" data-cost="${esc(r.who)}">
      <div class="who"><span class="name" title="${esc(r.who)}">${esc(r.who)}</span>${r.over ? '<span class="pill critical flag">over budget</span>' : ""}</div>
      <div class="track"><div class="fill ${r.cls}" style="width:${(r.cost / max) * 100}%"></div></div>
      <div class="nums">${money(r.cost, c.currency)}<br>${esc(r.note)}</div></div>`).join("") || `<div class="muted">No cost accrued yet.</div>`;
}

const TEAM_COLORS = ["--blue", "--violet", "--good", "--bad", "--u50"];

// cost each team accrued over the window, cumulative, from the warehouse's billing ledger
function renderCostChart(c) {
  const svg = $("chart-cost");
  const series = useWarehouse() ? warehouse.cost : [];
  const times = [...new Set(series.map((p) => p.at))].sort((a, b) => a - b);
  if (times.length < 2) { svg.style.display = "none"; $("cost-legend").innerHTML = ""; return; }
  svg.style.display = "";
  const css = getComputedStyle(document.documentElement);
  const teams = [...new Set(series.map((p) => p.team))].sort((a, b) => (a === "idle") - (b === "idle") || a.localeCompare(b));
  const colorOf = (t, i) => (t === "idle" ? css.getPropertyValue("--amber") : css.getPropertyValue(TEAM_COLORS[i % TEAM_COLORS.length])).trim();
  const lines = teams.map((t, i) => {
    let v = 0;
    const at = new Map(series.filter((p) => p.team === t).map((p) => [p.at, p.cost]));
    return { team: t, color: colorOf(t, i), values: times.map((x) => (v = at.get(x) ?? v)) };
  });
  const top = Math.max(1e-9, ...lines.flatMap((l) => l.values));
  lineChart(svg, times, lines, { yMax: top, format: (v) => money(v, c.currency), ticks: [0, top / 2, top] });
  $("cost-legend").innerHTML = `<span class="muted">cumulative, last hour</span>` + lines.map((l) =>
    `<span><i class="line" style="background:${l.color}"></i>${esc(l.team)}</span>`).join("");
}

function renderPending(q, now) {
  const rows = q.jobs.slice(0, 50).map((j) => `<tr data-job="${esc(j.job_id)}">
    <td>${esc(j.name || j.job_id)}</td><td>${esc(j.team)}</td>
    <td><span class="pill ${esc(j.priority)}">${esc(j.priority ?? "?")}</span></td>
    <td class="num">${j.gpus}</td><td><span class="pill ${esc(j.state)}">${esc(j.state)}</span></td>
    <td class="num">${ago(j.submitted_at == null ? null : now - j.submitted_at)}</td>
    <td class="reason">${esc(j.reason)}</td></tr>`);
  if (q.depth > 50) rows.push(`<tr class="empty"><td colspan="7">… and ${q.depth - 50} more</td></tr>`);
  $("pending").tBodies[0].innerHTML = rows.join("") || `<tr class="empty"><td colspan="7">Nothing is waiting.</td></tr>`;
}

function renderRunning(r, now) {
  const rows = r.jobs.slice(0, 100).map((j) => {
    const where = j.placements.map((p) => `${p.node}[${p.gpu_indices.join(",")}]`).join(", ");  // as chamber queue writes it
    return `<tr data-job="${esc(j.job_id)}"><td>${esc(j.name || j.job_id)}</td><td>${esc(j.team)}</td>
      <td class="num">${j.gpus}</td><td>${esc(where)}</td>
      <td class="num">${ago(j.started_at == null ? null : now - j.started_at)}</td></tr>`;
  });
  if (r.count > 100) rows.push(`<tr class="empty"><td colspan="5">… and ${r.count - 100} more</td></tr>`);
  $("running").tBodies[0].innerHTML = rows.join("") || `<tr class="empty"><td colspan="5">No job is running.</td></tr>`;
}

function renderFaults(f) {
  const held = f.held || [];
  $("faults-total").textContent = `${plural(f.faults_total, "fault")} · ${plural(f.isolations.length, "active isolation")}` +
    (held.length ? ` · ${held.length} held for confirmation` : "");
  $("held").innerHTML = held.map((h) =>
    `<span class="chip held" data-held="${esc(h.node)}${h.gpu_index == null ? "" : `/${h.gpu_index}`}" title="${esc(h.reason)}">held: ${esc(h.node)}${h.gpu_index == null ? "" : ` GPU ${h.gpu_index}`} (${esc(h.action.replace("_", " "))}, since ${esc(clock(h.at))}): confirm with <code>chamber health confirm ${esc(h.node)}${h.gpu_index == null ? "" : ` --gpu ${h.gpu_index}`}</code></span>`).join("");
  $("isolations").innerHTML = f.isolations.map((i) =>
    `<span class="chip" title="${esc(i.reason)}">${esc(i.node)}${i.gpu_index == null ? "" : ` GPU ${i.gpu_index}`}: ${esc(i.reason)}</span>`).join("");
  drawStrip($("timeline-strip"), f.timeline);
  const kinds = { fault: "fault", node_isolated: "isolated", gpu_isolated: "GPU isolated", node_restored: "restored", gpu_restored: "GPU restored", node_lost: "lost", isolation_held: "isolation held", isolation_dismissed: "hold dismissed", node_forgotten: "forgotten" };
  $("timeline").innerHTML = f.timeline.slice(0, 60).map((e) => `<li>
    <span class="t">${esc(clock(e.at))}</span><span class="sev ${esc(e.severity)}"></span>
    <span class="where">${esc(e.node)}${e.gpu_index == null ? "" : ` · GPU ${e.gpu_index}`}</span>
    <span><b>${esc(kinds[e.kind] ?? e.kind)}</b> ${esc(e.detail)}</span></li>`).join("") || `<li class="muted">No faults.</li>`;
}

// the last hours of faults and isolations on one time axis: dots by severity, bars while isolated
function drawStrip(svg, entries) {
  const W = Math.max(300, Math.round(svg.clientWidth || 600)), H = 54, L = 8, R = 8;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.style.display = entries.length ? "" : "none";
  if (!entries.length) { svg.innerHTML = ""; return; }
  const times = entries.map((e) => e.at);
  const t1 = Math.max(...times), t0 = Math.min(...times, t1 - 600);
  const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - R);
  const color = { critical: "var(--bad)", warning: "var(--amber)", info: "var(--good)" };
  let out = `<line class="grid-line" x1="${L}" x2="${W - R}" y1="30" y2="30"/>`;
  const open = {};
  for (const e of [...entries].sort((a, b) => a.at - b.at)) {
    const key = `${e.node}/${e.gpu_index ?? ""}`;
    if (e.kind.endsWith("isolated")) open[key] = e.at;
    if (e.kind.endsWith("restored") && open[key] != null) {
      out += `<rect x="${x(open[key])}" y="26" width="${Math.max(2, x(e.at) - x(open[key]))}" height="8" rx="2" fill="var(--bad)" fill-opacity="0.35"/>`;
      delete open[key];
    }
  }
  for (const at of Object.values(open)) {
    out += `<rect x="${x(at)}" y="26" width="${Math.max(2, x(t1) - x(at))}" height="8" rx="2" fill="var(--bad)" fill-opacity="0.35"/>`;
  }
  for (const e of entries) {
    out += `<circle cx="${x(e.at).toFixed(1)}" cy="${e.kind === "fault" ? 16 : 30}" r="4" fill="${color[e.severity] ?? "var(--blue)"}"><title>${esc(`${clock(e.at)} ${e.node}: ${e.kind} ${e.detail}`)}</title></circle>`;
  }
  out += `<text x="${L}" y="${H - 4}">${esc(clock(t0))}</text><text x="${W - R}" y="${H - 4}" text-anchor="end">${esc(clock(t1))}</text>`;
  svg.innerHTML = out;
}

let last = null;

function render(s) {
  last = s;
  renderCards(s);
  renderHeatmap(s.fleet);
  renderCharts(s.efficiency);
  renderTeams(s.teams.teams);
  renderCost(s.cost);
  renderCostChart(s.cost);
  renderPending(s.queue, s.at);
  renderRunning(s.running, s.at);
  renderFaults(s.faults);
  $("live-text").textContent = `live · ${int(s.events_seen)} events · ${clock(s.at)}`;
  showBus();
}

function setLive(on) {
  $("live-dot").className = on ? "dot" : "dot off";
  if (!on) $("live-text").textContent = "reconnecting…";
  else showBus();
}

// The gateway keeps pushing while its bus (NATS) is down, but the numbers are frozen then: /healthz
// answers 503, and the header says "bus down" instead of a green live dot. While the gateway is still
// folding the log at start, /api/* answers 503 and /healthz names the progress: "catching up".
let busDownSince = null;
let catchingUp = null;
function showBus() {
  if (catchingUp !== null) {
    $("live-dot").className = "dot off";
    $("live-text").textContent = `catching up · ${catchingUp}`;
    return;
  }
  if (busDownSince === null) return;
  $("live-dot").className = "dot off";
  $("live-text").textContent = `bus down since ${clock(busDownSince)} · numbers frozen`;
}
function checkBus() {
  fetch("/healthz")
    .then((r) => r.json().then((h) => {
      catchingUp = h.replaying || null;
      return !r.ok || h.nats_connected === false;
    }))
    .then((down) => {
      if (down && busDownSince === null) busDownSince = Date.now() / 1000;
      if (!down) busDownSince = null;
      showBus();
    })
    .catch(() => {})
    .finally(() => setTimeout(checkBus, catchingUp === null ? 5000 : 1000));
}

// Server-sent events, reconnecting on their own; polling if the browser has no EventSource.
function connect() {
  if (!window.EventSource || TOKEN) {
    const poll = () => api("/api/summary").then((r) => r.json()).then((s) => { setLive(true); render(s); })
      .catch(() => setLive(false)).finally(() => setTimeout(poll, 3000));
    poll();
    return;
  }
  const source = new EventSource("/api/stream");
  source.addEventListener("summary", (ev) => { catchingUp = null; setLive(true); render(JSON.parse(ev.data)); });
  source.onerror = () => {
    setLive(false);
    showBus();
    // a 503 (catching up) closes an EventSource for good: open a new one once it has had time
    if (source.readyState === EventSource.CLOSED) setTimeout(connect, 3000);
  };
}

// The fabric panel: its own document (/api/fabric), refreshed every few seconds.
const FABRIC_EVERY_MS = 5000;
const MAX_FABRIC_NODES = 256;

function renderFabric(f) {
  const now = Date.now() / 1000;
  const open = f.slowdowns.filter((s) => s.cleared_at == null).length;
  const flagged = f.nodes.filter((n) => n.flagged).length;
  $("fabric-summary").textContent = `${plural(open, "slow job")} · ${plural(flagged, "node")} with flagged links`;
  $("slowdowns").tBodies[0].innerHTML = f.slowdowns.slice(0, 30).map((s) => {
    const where = [s.node, s.gpu_index == null ? null : `GPU ${s.gpu_index}`, s.nic, s.leaf].filter((x) => x != null && x !== "").join(" · ");
    const state = s.cleared_at == null ? "slow" : `cleared (${s.cleared_reason})`;
    return `<tr data-job="${esc(s.job_id)}" class="${s.cleared_at == null ? "" : "cleared"}"><td>${esc(s.job_id)}</td><td>${esc(state)}</td>
      <td><b>${esc(s.culprit)}</b></td><td>${esc(where)}</td><td class="num">${Math.round(s.score * 100)} %</td>
      <td class="num">${ago(now - s.since)}</td><td class="reason">${esc(s.reason)}</td></tr>`;
  }).join("") || `<tr class="empty"><td colspan="7">No job is slow.</td></tr>`;
  const nodes = [...f.nodes].sort((a, b) => b.flagged - a.flagged).slice(0, MAX_FABRIC_NODES);
  $("fabric").innerHTML = nodes.map((n) => `<span class="node" title="${esc(n.leaf ?? "")}"><span class="name">${esc(n.node)}</span>` +
    n.nics.map((c) => {
      const cls = c.state === "down" ? "down" : c.flags.length ? "flag" : "ok";
      const tip = `${c.nic} ${c.state} ${c.rate_gbps ?? "?"} Gb/s tx ${c.tx_gbps ?? "?"} Gb/s ${c.flags.join(", ")}`;
      return `<i class="n ${cls}" title="${esc(tip)}"></i>`;
    }).join("") + "</span>").join("") || `<span class="muted">No fabric samples yet.</span>`;
}

// The job view: click a slow job to see each rank's GPU activity over time (the culprit outlined).
let shownJob = null;

function showJob(job) {
  shownJob = job;
  fetch(`/api/jobs/${encodeURIComponent(job)}/ranks`).then((r) => r.json()).then((a) => {
    if (!a.ok) { $("job-view").hidden = true; return; }
    renderJobHeat(a.result);
  }).catch(() => {});
}

function renderJobHeat(h) {
  const svg = $("job-heat");
  const rows = h.ranks.length, cols = h.activity_pct.length;
  const L = 120, W = Math.max(300, Math.round(svg.clientWidth || 900)), rowH = rows > 64 ? 3 : 10;
  const cw = (W - L) / Math.max(1, cols), H = rows * rowH + 4;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  const c = h.culprit || {};
  let out = "";
  h.ranks.forEach((rank, i) => {
    if (rows <= 64) out += `<text x="0" y="${i * rowH + rowH - 1}" font-size="9" fill="#9ca3af">${esc(rank.node)} gpu ${rank.gpu}</text>`;
    h.activity_pct.forEach((row, j) => {
      const v = row[i];
      out += `<rect x="${(L + j * cw).toFixed(1)}" y="${i * rowH}" width="${(cw + 0.5).toFixed(1)}" height="${rowH - 1}" fill="${v == null ? "#374151" : utilColor(v)}"/>`;
    });
    if (c.node === rank.node && c.gpu === rank.gpu) out += `<rect class="culprit" x="${L}" y="${i * rowH}" width="${W - L}" height="${rowH - 1}"/>`;
  });
  svg.innerHTML = out;
  const where = c.kind ? ` · culprit ${c.kind}${c.node ? ` ${c.node}` : ""}${c.gpu == null ? "" : ` GPU ${c.gpu}`}${c.leaf ? ` ${c.leaf}` : ""}` : "";
  $("job-view-title").textContent = `${h.job} · ${h.verdict}${where}`;
  $("job-view").hidden = false;
}

document.addEventListener("click", (ev) => {
  const row = ev.target.closest && ev.target.closest("#slowdowns tr[data-job]");
  if (row) showJob(row.dataset.job);
});

function pollFabric() {
  fetch("/api/fabric").then((r) => (r.ok ? r.json() : null)).then((f) => { if (f) renderFabric(f); })
    .catch(() => {}).finally(() => setTimeout(pollFabric, FABRIC_EVERY_MS));
  if (shownJob) showJob(shownJob);
}

connect();
checkBus();
fetchHistory();
pollFabric();
