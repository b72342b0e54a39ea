// KVCM console: every number comes from the service's own API methods (POST api/<method>),
// called with the bearer kept for this tab when the service has authentication on.
"use strict";

const REFRESH_MS = 5000;
const HISTORY = 120; // samples kept per group for the sparklines (10 minutes at 5 s)
const TOKEN_KEY = "kvcm.console.token";
const PAGES = ["groups", "instances", "storages", "traffic", "curves", "capacity"];
const GIB = 2 ** 30;

const state = {history: {}, previousCounters: null, previousTime: 0};

class Refused extends Error {}

async function api(method, body = {}) {
  const headers = {"Content-Type": "application/json"};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(`api/${method}`, {method: "POST", headers, body: JSON.stringify(body)});
  if ([401, 403, 429].includes(response.status)) {  // no or a wrong bearer, a forbidden role, locked out
    const answer = await response.json().catch(() => ({}));
    throw new Refused(answer.header?.status?.message || `HTTP ${response.status}`);
  }
  if (!response.ok) throw new Error(`${method}: HTTP ${response.status}`);
  const answer = await response.json();
  const status = answer.header?.status || {};
  if (status.code !== "OK") throw new Error(`${method}: ${status.code}: ${status.message || ""}`);
  return answer;
}

// ---------------------------------------------------------------- formatting

function num(value) { return Number(value || 0); }

function size(bytes) {
  bytes = num(bytes);
  for (const [unit, factor] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (Math.abs(bytes) >= factor) return `${(bytes / factor).toFixed(1)} ${unit}`;
  }
  return `${bytes} B`;
}

function pct(part, whole) { return whole > 0 ? `${(100 * part / whole).toFixed(1)}%` : "–"; }

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows.map(cells => el("tr", {}, ...cells.map(c => el("td", {}, c)))));
  if (!rows.length) body.append(el("tr", {}, el("td", {colspan: "99", class: "hint"}, "none")));
}

function bar(used, watermark, quota) {
  const box = el("div", {class: "bar", title: `${size(used)} of ${size(quota)}`});
  if (quota > 0) {
    box.append(el("div", {class: "bar-used", style: `width:${Math.min(100, 100 * used / quota)}%`}));
    if (watermark > 0) box.append(el("div", {class: "bar-mark", style: `left:${Math.min(100, 100 * watermark / quota)}%`}));
  }
  return box;
}

function sparkline(values, ceiling) {
  const svg = svgEl("svg", {class: "spark", viewBox: "0 0 120 24", preserveAspectRatio: "none"});
  const top = Math.max(ceiling, ...values, 1);
  const points = values.map((v, i) => `${(120 * i / Math.max(1, HISTORY - 1)).toFixed(1)},${(23 - 22 * v / top).toFixed(1)}`);
  svg.append(svgEl("polyline", {points: points.join(" "), fill: "none", stroke: "currentColor", "stroke-width": "1.5"}));
  const [lastX, lastY] = points[points.length - 1].split(",");
  svg.append(svgEl("circle", {cx: lastX, cy: lastY, r: "2", fill: "currentColor"}));  // visible from the 1st sample
  return svg;
}

// ---------------------------------------------------------------- metrics

function metricValue(point) {
  const v = point.metric_value || {};
  return v.int_value !== undefined ? num(v.int_value) : num(v.float_value);
}

function tags(point) { return Object.fromEntries((point.metric_tags || []).map(t => [t.tag_key, t.tag_value])); }

function byName(metrics, name) { return metrics.filter(p => p.metric_name === name); }

// Hit ratios of reads (getCacheLocation): blocks found over blocks asked, from the counters
// every read adds to, per instance and over all of them (weighted by what each asked, not a
// mean of the instances' ratios).
function hitRatios(metrics) {
  const counts = name => Object.fromEntries(byName(metrics, name).map(p => [tags(p).instance_id, metricValue(p)]));
  const found = counts("manager.get_cache_location_hit_block_counter");
  const asked = counts("manager.get_cache_location_query_block_counter");
  const perInstance = {};
  let foundTotal = 0, askedTotal = 0;
  for (const [instance, blocks] of Object.entries(asked)) {
    if (blocks <= 0) continue;
    perInstance[instance] = (found[instance] || 0) / blocks;
    foundTotal += found[instance] || 0;
    askedTotal += blocks;
  }
  return {perInstance, total: askedTotal > 0 ? foundTotal / askedTotal : null};
}

// ---------------------------------------------------------------- pages

// Per tier: each storage's bytes, and each storage type's against its quota_config entry.
function tiers(group) {
  const box = el("div", {class: "tiers"});
  for (const s of group.by_storage || []) {
    box.append(el("div", {}, `${s.storage_name} (${(s.storage_type || "").replace(/^ST_/, "").toLowerCase()}): ${size(s.used_bytes)}`));
  }
  for (const t of group.by_storage_type || []) {
    const cap = num(t.capacity);
    box.append(el("div", {class: "hint"}, `${(t.storage_type || "").replace(/^ST_/, "")}: ${size(t.used_bytes)}` +
      (cap ? ` of ${size(cap)} (${pct(num(t.used_bytes), cap)})` : "")));
  }
  return box;
}

function renderGroups(usage) {
  const rows = usage.map(g => {
    const used = num(g.used_bytes), quota = num(g.capacity), watermark = num(g.watermark_bytes);
    const history = state.history[g.name] = (state.history[g.name] || []).concat([used]).slice(-HISTORY);
    // A watermark above the quota (used_percentage above 1): reclaim never starts.
    const reclaimOff = quota > 0 && watermark > quota;
    const mark = reclaimOff
      ? el("span", {class: "reclaim-off", title: "reclaim is off: the watermark is above the quota, a full group refuses writes"},
           `off (${size(watermark)} > quota)`)
      : watermark ? size(watermark) : "–";
    return [g.name, quota ? size(quota) : "unlimited", size(used), pct(used, quota),
            mark, num(g.key_count).toLocaleString("en"), g.instances.length,
            bar(used, reclaimOff ? 0 : watermark, quota), sparkline(history, quota), tiers(g)];
  });
  fill("groups-table", rows);
  document.querySelectorAll("#groups-table tbody tr").forEach((row, i) => row.dataset.group = usage[i]?.name || "");
}

function renderInstances(instances, usage, ratios) {
  const used = {};
  for (const g of usage) for (const i of g.instances) used[i.instance_id] = i;
  fill("instances-table", instances.map(i => [
    i.instance_id, i.instance_group_name, i.block_size,
    (i.location_spec_infos || []).map(s => `${s.name} ${size(s.size)}`).join(", "),
    i.model_deployment ? `${i.model_deployment.model_name} (${i.model_deployment.dtype})` : "",
    size(used[i.instance_id]?.used_bytes), num(used[i.instance_id]?.key_count).toLocaleString("en"),
    i.instance_id in ratios.perInstance ? `${(100 * ratios.perInstance[i.instance_id]).toFixed(1)}%` : "–"]));
}

// checkHealth's storage states: green when usable, amber when suspect or not probed yet.
const HEALTH_PILL = {HEALTHY: "ok", SUSPECT: "warn", NOT_CHECKED: "warn"};

function renderStorages(storages, health) {
  const states = Object.fromEntries((health.storages || []).map(s => [s.storage_unique_name, s]));
  fill("storages-table", storages.map(s => {
    const spec = s.nfs || s.s3 || s.threefs || s.vcnsthreefs || s.mooncake || s.tair_mem_pool || s.local || {};
    // A data storage by its spec; an event-report storage (engines' reported blocks) has
    // none, only its type: ST_EVENT_REPORT_L1P5 → "event report L1P5".
    const type = Object.keys(s).find(k => ["nfs", "s3", "threefs", "vcnsthreefs", "mooncake", "tair_mem_pool", "local"].includes(k))
      || (s.storage_type || "").replace(/^ST_EVENT_REPORT_/, "event report ").replace(/^ST_/, "").toLowerCase();
    const where = spec.root_path || spec.bucket || spec.mountpoint || spec.domain || spec.master_service_entry || "";
    const name = s.global_unique_name;
    const state = states[name] || {status: "NOT_CHECKED", reason: "not probed yet"};
    return [name, type, where, el("span", {class: `pill ${HEALTH_PILL[state.status] || "bad"}`}, state.status),
      state.reason || ""];
  }));
}

function renderTraffic(metrics, ratios) {
  const now = Date.now() / 1000;
  const counters = {}, latency = {}, errors = {}, errorCodes = {};
  for (const p of byName(metrics, "service.query_counter")) counters[tags(p).api_name] = metricValue(p);
  for (const p of byName(metrics, "service.query_rt_us")) latency[tags(p).api_name] = metricValue(p);
  for (const p of byName(metrics, "service.error_counter")) {
    const {api_name: api, code = "?"} = tags(p);
    errors[api] = (errors[api] || 0) + metricValue(p);
    (errorCodes[api] = errorCodes[api] || {})[code] = metricValue(p);
  }
  const previous = state.previousCounters, dt = now - state.previousTime;
  const rate = api => previous && dt > 0 ? Math.max(0, (counters[api] - (previous.calls[api] || 0)) / dt) : null;
  const totalRate = previous && dt > 0 ? Object.keys(counters).reduce((s, a) => s + rate(a), 0) : null;
  const errorTotal = Object.values(errors).reduce((s, v) => s + v, 0);
  const errorRate = previous && dt > 0 ? Math.max(0, (errorTotal - previous.errors) / dt) : null;
  state.previousCounters = {calls: counters, errors: errorTotal};
  state.previousTime = now;

  document.getElementById("hit-ratio").textContent = ratios.total === null ? "–" : `${(100 * ratios.total).toFixed(1)}%`;
  document.getElementById("request-rate").textContent = totalRate === null ? "…" : totalRate.toFixed(2);
  document.getElementById("error-rate").textContent = errorRate === null ? "…" : errorRate.toFixed(2);
  fill("traffic-table", Object.keys(counters).sort().map(api => [
    api, counters[api].toLocaleString("en"), rate(api) === null ? "…" : rate(api).toFixed(2),
    latency[api] ? `${(latency[api] / 1000).toFixed(2)} ms` : "–", (errors[api] || 0).toLocaleString("en"),
    Object.entries(errorCodes[api] || {}).sort().map(([code, n]) => `${code} ${n.toLocaleString("en")}`).join(", ")]));
}

function renderCapacity(report) {
  const empty = !report.curves || !report.curves.length;
  document.getElementById("capacity-empty").hidden = !empty;
  document.getElementById("capacity-report").hidden = empty;
  if (empty) return;
  const rec = report.recommendation;
  document.getElementById("recommendation").textContent = rec
    ? `Recommendation: ${rec.policy} at ${num(rec.capacity).toLocaleString("en")} blocks, ` +
      `block hit ratio ${(100 * rec.block_hit_ratio).toFixed(1)}% (target ${(100 * report.target_hit_ratio).toFixed(1)}%).`
    : `No capacity of the sweep reaches the target hit ratio (${(100 * report.target_hit_ratio).toFixed(1)}%).`;
  const finished = num(report.finished_time_ms) ? `finished ${new Date(num(report.finished_time_ms)).toISOString()}` : "";
  document.getElementById("capacity-source").textContent =
    [report.execution_name ? `Sweep ${report.execution_name}` : "Latest sweep", finished, report.report_uri]
      .filter(Boolean).join(" · ");
  drawCurves(document.getElementById("curve"), report.curves, rec);
}

// A plot's frame: the axes, the y axis's hit-ratio ticks and the x axis's title; ``y`` maps
// a ratio to its height.
function plotFrame(W, H, L, R, T, B, y, title) {
  const parts = [svgEl("line", {x1: L, y1: y(0), x2: W - R, y2: y(0), class: "axis"}),
                 svgEl("line", {x1: L, y1: y(0), x2: L, y2: y(1), class: "axis"})];
  for (const r of [0, 0.25, 0.5, 0.75, 1]) {
    const label = svgEl("text", {x: L - 6, y: y(r) + 4, class: "tick", "text-anchor": "end"});
    label.textContent = `${r * 100}%`;
    parts.push(label);
  }
  const axis = svgEl("text", {x: (L + W - R) / 2, y: H - 4, class: "tick", "text-anchor": "middle"});
  axis.textContent = title;
  parts.push(axis);
  return parts;
}

// An x tick label, the outermost ones anchored inside the plot so that they are never clipped.
function xTick(x, text, first, last, y) {
  const anchor = last && !first ? "end" : first ? "start" : "middle";
  const label = svgEl("text", {x, y, class: "tick", "text-anchor": anchor});
  label.textContent = text;
  return label;
}

function drawCurves(svg, curves, rec) {
  const W = 640, H = 320, L = 56, R = 16, T = 16, B = 40;
  const caps = curves.flatMap(c => c.capacities.map(num)).filter(c => c > 0);
  const lo = Math.log10(Math.min(...caps)), hi = Math.max(Math.log10(Math.max(...caps)), lo + 1e-9);
  const x = c => L + (W - L - R) * (Math.log10(Math.max(num(c), 1)) - lo) / (hi - lo);
  const y = r => T + (H - T - B) * (1 - r);
  const parts = plotFrame(W, H, L, R, T, B, y, "capacity (blocks, log scale) → block hit ratio");
  const ticks = [...new Set(caps)].sort((a, b) => a - b);
  ticks.forEach((c, i) => parts.push(xTick(x(c), c.toLocaleString("en"), i === 0, i === ticks.length - 1, H - B + 16)));
  curves.forEach((curve, i) => {
    const points = curve.capacities.map((c, j) => [c, curve.block_hit_ratio[j]]).filter(([, r]) => r !== null);
    parts.push(svgEl("polyline", {points: points.map(([c, r]) => `${x(c).toFixed(1)},${y(r).toFixed(1)}`).join(" "),
                                  class: `curve curve-${i % 4}`}));
    const legend = svgEl("text", {x: W - R - 4, y: T + 14 + 16 * i, class: `legend curve-${i % 4}`, "text-anchor": "end"});
    legend.textContent = curve.policy;
    parts.push(legend);
  });
  if (rec) parts.push(svgEl("circle", {cx: x(rec.capacity), cy: y(rec.block_hit_ratio), r: 5, class: "pick"}));
  svg.replaceChildren(...parts);
}

function ratioText(r) { return r === null || r === undefined ? "–" : `${(100 * r).toFixed(1)}%`; }

// One group's live curve: hit ratio against the quota in GiB (linear), the current quota a
// dashed line, the tuning job's recommendation a ring.
function drawHitCurve(svg, curve) {
  const W = 640, H = 280, L = 56, R = 16, T = 16, B = 40;
  const points = (curve.points || []).filter(p => p.hit_ratio !== null && p.hit_ratio !== undefined)
    .map(p => [num(p.quota_bytes) / GIB, p.hit_ratio]);
  const quota = num(curve.quota_bytes) / GIB;
  const top = Math.max(...points.map(([q]) => q), quota, 1e-9);
  const x = q => L + (W - L - R) * q / top;
  const y = r => T + (H - T - B) * (1 - r);
  const parts = plotFrame(W, H, L, R, T, B, y, "quota (GiB) → block hit ratio");
  const ticks = [0, 0.25, 0.5, 0.75, 1].map(f => f * top);
  ticks.forEach((q, i) => parts.push(xTick(x(q), q.toPrecision(3), i === 0, i === ticks.length - 1, H - B + 16)));
  parts.push(svgEl("polyline", {points: points.map(([q, r]) => `${x(q).toFixed(1)},${y(r).toFixed(1)}`).join(" "),
                                class: "curve curve-0"}));
  if (quota > 0) {
    parts.push(svgEl("line", {x1: x(quota), y1: y(0), x2: x(quota), y2: y(1), class: "quota-line"}));
    const label = svgEl("text", {x: x(quota) + 4, y: y(1) + 10, class: "tick quota-label"});
    label.textContent = `quota ${size(curve.quota_bytes)}`;
    parts.push(label);
    parts.push(svgEl("circle", {cx: x(quota), cy: y(num(curve.hit_ratio_at_quota)), r: 4, class: "at-quota"}));
  }
  const rec = curve.recommendation;
  if (rec && rec.hit_ratio !== null && rec.hit_ratio !== undefined) {
    parts.push(svgEl("circle", {cx: x(num(rec.quota_bytes) / GIB), cy: y(rec.hit_ratio), r: 7, class: "pick recommendation"}));
  }
  svg.replaceChildren(...parts);
}

function renderHitCurves(curves) {
  const filled = curves.filter(c => (c.points || []).length);
  document.getElementById("curves-empty").hidden = filled.length > 0;
  document.getElementById("curves-list").replaceChildren(...filled.map(curve => {
    const svg = svgEl("svg", {class: "hit-curve", viewBox: "0 0 640 280", role: "img",
                              "aria-label": `hit ratio of ${curve.instance_group} by quota`});
    drawHitCurve(svg, curve);
    const rec = curve.recommendation;
    const asked = (curve.instances || []).reduce((s, i) => s + num(i.read_blocks), 0);
    const rate = (curve.instances || []).map(i => i.sample_rate).reduce((a, b) => Math.min(a, b), 1);
    const through = num(curve.through_time_ms), updated = num(curve.updated_time_ms);
    const figures = el("p", {class: "figures"},
      `At the quota (${size(curve.quota_bytes)}): ${ratioText(curve.hit_ratio_at_quota)} · ` +
      `×0.5: ${ratioText(curve.hit_ratio_at_half_quota)} · ×2: ${ratioText(curve.hit_ratio_at_double_quota)}` +
      (rec ? ` · tuning (${rec.status}): ${ratioText(rec.hit_ratio)}` : " · no tuning run yet"));
    const kept = (curve.instances || []).reduce((s, i) => s + num(i.kept_keys), 0);
    const doubt = curve.confident ? [] : [el("p", {class: "not-confident"},
      `Not yet meaningful: ${kept.toLocaleString("en")} sampled keys, an instance needs ` +
      `${num(curve.min_kept_keys).toLocaleString("en")} (small workloads mislead the estimate).`)];
    const freshness = el("p", {class: "hint freshness"},
      `${asked.toLocaleString("en")} blocks asked, sample rate ${rate.toPrecision(2)}; ` +
      `traffic through ${through ? new Date(through).toISOString() : "–"}, ` +
      `curve updated ${updated ? new Date(updated).toISOString() : "–"}`);
    const box = el("div", {class: "hit-curve-group"}, el("h3", {}, curve.instance_group), figures, ...doubt, svg, freshness);
    box.dataset.group = curve.instance_group;
    return box;
  }));
}

// The badge: green only when every group can write; amber when a group lost a storage but
// writes to another; red with checkHealth's reasons otherwise (in its tooltip and the banner).
function renderHealth(health) {
  const degraded = health.degraded_groups || [];
  const pill = document.getElementById("health");
  const [text, kind] = !health.is_health ? ["UNHEALTHY", "bad"] : degraded.length ? ["DEGRADED", "warn"] : ["healthy", "ok"];
  pill.textContent = text;
  pill.className = `pill ${kind}`;
  const reasons = (health.problems || []).concat(
    degraded.filter(g => g.status !== "NO_WRITABLE_STORAGE").map(g => `instance group '${g.instance_group_name}' is degraded: ${g.reason}`));
  pill.title = reasons.join("\n");
  const banner = document.getElementById("health-problems");
  banner.hidden = reasons.length === 0;
  banner.replaceChildren(...reasons.map(r => el("div", {}, r)));
}

// ---------------------------------------------------------------- refresh loop

async function refresh() {
  const error = document.getElementById("error");
  try {
    const [health, usage, instances, storages, metrics, report] = await Promise.all([
      api("checkHealth"), api("getInstanceGroupUsage"), api("listInstanceInfo"), api("listStorage"),
      api("getMetrics"), api("getCapacityReport")]);
    document.getElementById("signin").hidden = true;
    renderHealth(health);
    const ratios = hitRatios(metrics.metrics || []);
    renderGroups(usage.usage || []);
    renderInstances(instances.instance_info || [], usage.usage || [], ratios);
    renderStorages(storages.storage || [], health);
    renderTraffic(metrics.metrics || [], ratios);
    renderCapacity(report);
    // A group removed since the usage was read has no curve to show: the others still do.
    const curves = await Promise.all((usage.usage || []).map(g => api("getGroupHitCurve", {name: g.name})
      .catch(exc => { if (exc instanceof Refused) throw exc; return null; })));
    renderHitCurves(curves.filter(Boolean));
    document.getElementById("refreshed").textContent = `updated ${new Date().toLocaleTimeString("en-GB")}`;
    document.body.dataset.loaded = "true";
    error.hidden = true;
  } catch (exc) {
    if (exc instanceof Refused) {
      // Without a bearer yet, the refusal is the service asking for one, not a mistake to show.
      const tried = sessionStorage.getItem(TOKEN_KEY) !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      document.getElementById("signin").hidden = false;
      document.getElementById("signin-error").textContent = tried ? exc.message : "";
    } else {
      error.textContent = String(exc.message || exc);
      error.hidden = false;
    }
  }
}

function showPage() {
  const page = PAGES.includes(location.hash.slice(1)) ? location.hash.slice(1) : PAGES[0];
  for (const name of PAGES) {
    document.getElementById(`page-${name}`).hidden = name !== page;
    document.querySelector(`nav a[data-page=${name}]`).classList.toggle("active", name === page);
  }
}

document.getElementById("signin").addEventListener("submit", event => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  document.getElementById("signin-error").textContent = "";  // the answer to this bearer replaces it
  refresh();
});
window.addEventListener("hashchange", showPage);
showPage();
refresh();
setInterval(refresh, REFRESH_MS);
