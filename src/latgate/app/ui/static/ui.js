// latgate /ui: polls /ui/state once a second and renders it. No framework, no build step.
"use strict";
const POLL_MS = 1000;
const CHART_WINDOW_S = 300; // the TTFT chart's last five minutes
const seen = new Set();      // request ids already in the chart history
const history = {};          // provider -> [[epoch s, ttft ms], ...] observed
const estimates = {};        // provider -> [[epoch s, predicted ttft ms at 1k tokens], ...]
let last = null;

const $ = (id) => document.getElementById(id);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const ms = (v) => (v == null ? "–" : v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : Math.round(v).toString());
const age = (s) => (s == null ? "–" : s < 1 ? "now" : s < 90 ? `${Math.round(s)} s ago` : `${Math.round(s / 60)} min ago`);
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
const slug = (s) => s.replace(/[^a-z]+/gi, "-").toLowerCase();

async function poll() {
  try {
    const response = await fetch("/ui/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    last = await response.json();
    remember(last);
    render(last);
    $("live").className = "live on";
    $("live").textContent = `live · ${clock(last.now)}`;
  } catch (error) {
    $("live").className = "live off";
    $("live").textContent = `disconnected (${error.message})`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function remember(state) {
  const horizon = state.now - CHART_WINDOW_S;
  for (const r of state.requests) {
    if (seen.has(r.id + r.at) || r.ttft_ms == null) continue;
    seen.add(r.id + r.at);
    (history[r.provider] ??= []).push([r.at, r.ttft_ms]);
  }
  for (const [name, p] of Object.entries(state.providers)) {
    const predicted = p.endpoints.map((e) => e.predicted_ttft_ms_at_1k_tokens).filter((v) => v != null && v > 0);
    if (predicted.length) (estimates[name] ??= []).push([state.now, Math.min(...predicted)]);
  }
  for (const series of [history, estimates]) {
    for (const name of Object.keys(series)) series[name] = series[name].filter(([t]) => t >= horizon).sort((a, b) => a[0] - b[0]);
  }
  if (seen.size > 20000) seen.clear();
}

function render(state) {
  $("strategy").textContent = `strategy ${state.strategy}`;
  $("version").textContent = `v${state.version}`;
  renderTotals(state);
  renderProviders(state);
  renderRequests(state);
  renderEvents(state);
}

function renderTotals(state) {
  const eps = Object.values(state.providers).flatMap((p) => p.endpoints);
  const healthy = eps.filter((e) => e.healthy).length;
  const inflight = eps.reduce((n, e) => n + (e.in_flight || 0), 0);
  const recent = state.requests.filter((r) => r.at >= state.now - 60);
  const errors = recent.filter((r) => r.status >= 500).length;
  const ttfts = recent.map((r) => r.ttft_ms).filter((v) => v != null).sort((a, b) => a - b);
  const p50 = ttfts.length ? ttfts[Math.floor(ttfts.length / 2)] : null;
  const tiles = [
    [`${healthy}/${eps.length}`, "endpoints healthy"],
    [inflight, "in flight"],
    [recent.length, "requests, last minute"],
    [errors, "5xx, last minute"],
    [ms(p50), "TTFT p50 ms, last minute"],
    [state.events.filter((e) => e.at >= state.now - 60).length, "events, last minute"],
  ];
  $("totals").innerHTML = tiles.map(([v, label]) => `<div class="tile"><b>${esc(v)}</b><span>${esc(label)}</span></div>`).join("");
}

// pooled: the endpoint shares its pool with others, so a prefix index has a placement to make
function endpointHtml(e, pooled) {
  const m = e.ttft_model || {};
  const cap = e.capacity || 0;
  const load = cap ? Math.min(100, (100 * e.in_flight) / cap) : 0;
  const engine = e.engine ? `${e.engine.running ?? "–"} run · ${e.engine.waiting ?? "–"} wait <span>(${age(e.engine.age_seconds)})</span>` : "–";
  const probe = e.probe ? `${e.probe.ok ? "ok" : "failed"} ${ms(e.probe.ms)} ms <span>(${age(e.probe.age_seconds)})</span>` : "off";
  const evidence = `${m.observations ?? 0} obs` + (m.age_seconds != null ? `, ${age(m.age_seconds)}` : "");
  const pct = (v) => (v == null ? "–" : `${(100 * v).toFixed(0)}%`);
  const index = pooled ? e.prefix_index : null;
  const hits = e.cache_hits;
  const cache = index
    ? `${esc(index.entries)} samples · ${esc(index.held_tokens)} / ${esc(index.effective_capacity_tokens)} tok`
    : "";
  const hitRatio = hits ? `${pct(hits.predicted_ratio)} predicted · ${pct(hits.reported_ratio)} reported` : "";
  const circuit = e.circuit + (e.circuit_reason && e.circuit !== "closed" ? ` (${e.circuit_reason})` : "") + (e.reopens_in_seconds ? `, trial in ${e.reopens_in_seconds.toFixed(1)} s` : "");
  return `<div class="ep">
    <div class="ep-head"><span class="dot ${esc(e.circuit)}"></span>${esc(e.id)} <span class="circuit">${esc(circuit)}</span></div>
    <div class="kv">
      <div><span>in flight</span>${esc(e.in_flight)}${cap ? ` / ${esc(cap)}` : ""}</div>
      <div><span>TTFT@1k</span>${ms(e.predicted_ttft_ms_at_1k_tokens)} ms</div>
      <div><span>ITL</span>${ms(e.itl_ms)} ms</div>
      <div><span>evidence</span>${esc(evidence)}</div>
      <div><span>queue</span>${ms(e.queue_ms)} ms</div>
      <div><span>errors</span>${esc(((e.error_rate || 0) * 100).toFixed(0))}%</div>
      <div><span>engine</span>${engine}</div>
      <div><span>probe</span>${probe}</div>
      <div><span>served</span>${esc(e.requests)}</div>
      ${index ? `<div class="prefix-index"><span>prefix index</span>${cache}</div>` : ""}
      ${hits ? `<div class="cache-hits"><span>cache hits</span>${esc(hitRatio)}</div>` : ""}
    </div>
    <div class="load" title="in flight / capacity"><i style="width:${load}%"></i></div>
  </div>`;
}

function renderProviders(state) {
  const root = $("providers");
  for (const [name, p] of Object.entries(state.providers)) {
    let card = root.querySelector(`[data-provider="${CSS.escape(name)}"]`);
    if (!card) {
      card = document.createElement("div");
      card.className = "card";
      card.dataset.provider = name;
      card.innerHTML = `<h3><span class="dot"></span><span class="name"></span></h3><div class="badges"></div><div class="eps"></div>
        <canvas class="chart"></canvas><div class="legend"><i style="background:#5b9cf0"></i>TTFT per request (ms)<i style="background:#e0a32e"></i>predicted at 1k tokens</div>`;
      card.querySelector(".name").textContent = name;
      root.appendChild(card);
    }
    const up = p.endpoints.some((e) => e.healthy);
    card.querySelector("h3 .dot").className = `dot ${up ? "closed" : "open"}`;
    const q = p.queue && p.queue.enabled ? p.queue : null;
    const queued = q && `queue ${q.waiting} waiting (${q.waiting_by_priority.interactive} interactive, ${q.waiting_by_priority.default} default, ${q.waiting_by_priority.batch} batch) · ${q.admitted} waited · ${q.overflow} overflowed · ${q.shed} shed · ${q.preempted} preempted`;
    const badges = [p.role && `role ${p.role}`, p.engine && `engine ${p.engine}`, p.connector && `connector ${p.connector}`, ...(p.models || []), queued].filter(Boolean);
    card.querySelector(".badges").innerHTML = badges.map((b) => `<span class="badge">${esc(b)}</span>`).join("");
    card.querySelector(".eps").innerHTML = p.endpoints.map((e) => endpointHtml(e, p.endpoints.length > 1)).join("");
    drawChart(card.querySelector("canvas"), history[name] || [], estimates[name] || [], state.now);
  }
  for (const card of [...root.children]) if (!(card.dataset.provider in state.providers)) card.remove();
}

function drawChart(canvas, points, line, now) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio; canvas.height = h * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, w, h);
  const values = points.map((p) => p[1]).concat(line.map((p) => p[1]));
  const top = Math.max(1, ...values) * 1.15;
  // the window grows with the data seen, from one minute up to five
  const first = Math.min(now - 60, ...points.map((p) => p[0]), ...line.map((p) => p[0]));
  const span = Math.min(CHART_WINDOW_S, now - first);
  const x = (t) => 30 + ((t - (now - span)) / span) * (w - 36);
  const y = (v) => h - 14 - (v / top) * (h - 24);
  g.fillStyle = "#8a93a3"; g.font = "10px system-ui"; g.strokeStyle = "#262d3a"; g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    g.beginPath(); g.moveTo(30, y(top * f / 1.15)); g.lineTo(w - 6, y(top * f / 1.15)); g.stroke();
    g.fillText(ms(top * f / 1.15), 2, y(top * f / 1.15) + 3);
  }
  g.fillText(span >= 90 ? `-${Math.round(span / 60)} min` : `-${Math.round(span)} s`, 30, h - 2); g.fillText("now", w - 26, h - 2);
  if (line.length > 1) {
    g.strokeStyle = "#e0a32e"; g.beginPath();
    line.forEach(([t, v], i) => (i ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
    g.stroke();
  }
  g.fillStyle = "#5b9cf0";
  for (const [t, v] of points) { g.beginPath(); g.arc(x(t), y(v), 2.2, 0, 6.3); g.fill(); }
  if (!points.length && line.length < 2) { g.fillStyle = "#8a93a3"; g.fillText("no first tokens yet", w / 2 - 40, h / 2); }
}

function renderRequests(state) {
  const select = $("provider-filter");
  for (const name of Object.keys(state.providers)) {
    if (![...select.options].some((o) => o.value === name)) select.add(new Option(name, name));
  }
  const text = $("filter").value.trim().toLowerCase();
  const provider = select.value, status = $("status-filter").value;
  const rows = state.requests.filter((r) => {
    if (provider && r.provider !== provider) return false;
    if (status === "ok" && !(r.status >= 200 && r.status < 300)) return false;
    if (status === "error" && r.status < 400) return false;
    if (!text) return true;
    return [r.provider, r.endpoint, r.model, r.reason, r.status, r.error, r.path].join(" ").toLowerCase().includes(text);
  });
  $("shown").textContent = `${rows.length} of ${state.requests.length}`;
  $("requests").innerHTML = rows.length
    ? rows.map((r) => `<tr>
      <td>${clock(r.at)}</td><td>${esc(r.provider)}</td><td>${esc(r.endpoint)}</td><td>${esc(r.model)}</td>
      <td class="reason">${esc(r.reason || "–")}</td><td class="num">${ms(r.ttft_ms)}</td>
      <td class="num">${r.tokens_per_second == null ? "–" : Math.round(r.tokens_per_second)}</td>
      <td class="num">${ms(r.e2e_ms)}</td><td class="num">${esc(r.completion_tokens)}</td>
      <td class="num ${r.status >= 200 && r.status < 300 ? "status-ok" : "status-err"}" title="${esc(r.error || "")}">${esc(r.status)}</td></tr>`).join("")
    : `<tr><td colspan="10" class="empty">no requests yet: send one to ${esc(location.origin)}/v1/chat/completions</td></tr>`;
}

function renderEvents(state) {
  $("events").innerHTML = state.events.length
    ? state.events.map((e) => `<li><time>${clock(e.at)}</time><span class="kind ${slug(e.kind)}">${esc(e.kind)}</span>${esc(e.detail)}${e.count > 1 ? ` ×${esc(e.count)}` : ""}</li>`).join("")
    : `<li class="empty">hedges, overflows, ejections, admission waits, retries and fallbacks appear here as they happen</li>`;
}

for (const id of ["filter", "provider-filter", "status-filter"]) $(id).addEventListener("input", () => last && renderRequests(last));
poll();
