// fleet.js — the fleet view: stages, throughput chart, backends and jobs by status, polled every
// second and updated in place (rows are keyed and only their text changes).

import { getJSON, noteStatus } from "./api.js";
import { card, clock, fill, fmtInt, fmtSecs, h, s, setText, STAGES, STATUSES, statusBadge } from "./dom.js";

const POLL_MS = 1000;

export function mountFleet(root, { ctx }) {
  const view = buildSkeleton();
  root.append(view.page);
  let lastOkAt = null;

  ctx.poll(async () => {
    try {
      const st = await getJSON("/v1/status");
      if (!ctx.alive) return;
      update(view, st);
      lastOkAt = new Date();
      setText(view.updated, `updated ${clock(lastOkAt)}`);
      view.updated.classList.remove("warn");
    } catch (err) {
      if (!ctx.alive) return;
      const since = lastOkAt ? ` (last ok ${clock(lastOkAt)})` : "";
      setText(view.updated, `update failed: ${err.message}${since}`);
      view.updated.classList.add("warn");
    }
    view.page.setAttribute("data-ready", "1");
  }, POLL_MS);
}

// ---- skeleton ---------------------------------------------------------------------------------

function buildSkeleton() {
  const v = {};
  v.title = h("h1", null, "Fleet");
  v.meta = h("span", { class: "muted" });
  v.notReady = h("span", { class: "badge warn-badge", hidden: true });
  v.updated = h("span", { class: "muted updated", "data-testid": "fleet-updated" }, "loading…");
  v.offline = h("div", { class: "notice", hidden: true });

  // stages
  v.stageBody = h("tbody");
  v.stageRows = new Map();
  v.stagesCard = card(
    "Stages",
    h("table", { class: "grid stages" }, h("thead", null, h("tr", null, h("th", null, "stage"), h("th", { class: "num" }, "queued"), h("th", { class: "num" }, "active / workers"), h("th", null, "load"))), v.stageBody),
    (v.sandboxes = h("div", { class: "muted small sandboxes" })),
  );

  // throughput
  v.chart = s("svg", { class: "chart", "data-testid": "throughput-chart", viewBox: "0 0 600 170", preserveAspectRatio: "none", role: "img", "aria-label": "throughput per stage" });
  v.legend = h("div", { class: "legend" });
  v.chartCaption = h("span", { class: "muted small" });
  v.chartCard = card("Throughput", v.chartCaption, v.chart, v.legend);

  // jobs by status
  v.statusList = h("div", { class: "status-counts" });
  v.statusItems = new Map();
  v.jobsTotal = h("span", { class: "muted small" });
  v.statusCard = card("Jobs by status", v.statusList, v.jobsTotal);

  // backends
  v.backendBody = h("tbody");
  v.backendRows = new Map();
  v.pausedModels = h("div", { class: "notice small", hidden: true });
  const bh = ["id", "model", "kind", "url", "policy", "load", "state", "served", "failures", "last error"];
  v.backendsCard = card(
    "Backends",
    v.pausedModels,
    h("table", { class: "grid backends" }, h("thead", null, h("tr", null, bh.map((t) => h("th", { class: ["policy", "served", "failures"].includes(t) ? "num" : null }, t)))), v.backendBody),
  );

  v.page = h(
    "div",
    { class: "page fleet", "data-testid": "fleet" },
    h("div", { class: "page-head" }, v.title, v.meta, v.notReady, h("span", { class: "spacer" }), v.updated),
    v.offline,
    (v.grid = h("div", { class: "fleet-grid" }, h("div", { class: "col" }, v.stagesCard, v.statusCard), h("div", { class: "col" }, v.chartCard))),
    v.backendsCard,
  );
  return v;
}

// ---- update -----------------------------------------------------------------------------------

function update(v, st) {
  noteStatus(st);
  const offline = !!st.offline;
  v.offline.hidden = !offline;
  if (offline) setText(v.offline, `offline viewer of ${st.source || "(unknown file)"}`);
  v.stagesCard.hidden = offline;
  v.chartCard.hidden = offline;
  v.backendsCard.hidden = offline;
  v.grid.classList.toggle("offline", offline);

  const bits = [];
  if (st.node) bits.push(st.node);
  if (st.uptime_s !== undefined && st.uptime_s !== null) bits.push(`up ${fmtSecs(st.uptime_s)}`);
  setText(v.meta, bits.join(" · "));
  v.notReady.hidden = !st.not_ready;
  if (st.not_ready) setText(v.notReady, `not ready: ${st.not_ready}`);

  if (!offline) {
    updateStages(v, st.stages || {});
    setText(v.sandboxes, `live sandboxes: ${fmtInt(st.live_sandboxes ?? 0)}`);
    const fig = st.figures || {};
    drawThroughput(v, fig.throughput || {}, fig.throughput_bucket_s || 10);
    updateBackends(v, st.backends || [], st.paused_models || []);
  }
  updateStatusCounts(v, st.jobs || {});
}

function orderedKeys(obj, preferred) {
  const keys = preferred.filter((k) => k in obj);
  for (const k of Object.keys(obj)) if (!keys.includes(k)) keys.push(k);
  return keys;
}

// ---- stages -----------------------------------------------------------------------------------

function updateStages(v, stages) {
  const names = orderedKeys(stages, STAGES);
  for (const name of names) {
    let row = v.stageRows.get(name);
    if (!row) {
      row = {
        queued: h("span", { "data-testid": "queued" }),
        active: h("span", { "data-testid": "active" }),
        workers: h("span", { "data-testid": "workers" }),
        fill: h("span", { class: `fill stage-${name}` }),
        queueFill: h("span", { class: "fill queue" }),
      };
      row.tr = h(
        "tr",
        { "data-testid": `stage-${name}` },
        h("td", null, h("span", { class: `dot stage-${name}` }), name),
        h("td", { class: "num" }, row.queued),
        h("td", { class: "num" }, row.active, h("span", { class: "muted" }, " / "), row.workers),
        h("td", null, h("span", { class: "minibar", title: "" }, row.fill), h("span", { class: "minibar queuebar" }, row.queueFill)),
      );
      v.stageRows.set(name, row);
      v.stageBody.append(row.tr);
    }
    const sd = stages[name] || {};
    const queued = Number(sd.queued) || 0;
    const active = Number(sd.active) || 0;
    const workers = Number(sd.workers) || 0;
    setText(row.queued, queued);
    setText(row.active, active);
    setText(row.workers, workers);
    const util = workers > 0 ? Math.min(1, active / workers) : 0;
    row.fill.style.width = `${(util * 100).toFixed(1)}%`;
    row.fill.parentElement.title = `${active} of ${workers} workers busy`;
    // queue bar: queued relative to workers, capped at 4× workers
    const qr = workers > 0 ? Math.min(1, queued / (4 * workers)) : queued > 0 ? 1 : 0;
    row.queueFill.style.width = `${(qr * 100).toFixed(1)}%`;
    row.queueFill.parentElement.title = `${queued} queued`;
  }
  for (const [name, row] of v.stageRows) {
    if (!(name in stages)) {
      row.tr.remove();
      v.stageRows.delete(name);
    }
  }
}

// ---- throughput chart -------------------------------------------------------------------------

const W = 600;
const H = 170;
const PAD = { l: 34, r: 8, t: 8, b: 20 };

function niceMax(x) {
  if (x <= 1) return 1;
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function drawThroughput(v, thr, bucketS) {
  const stages = orderedKeys(thr, STAGES);
  const series = stages.map((name) => ({ name, pts: (thr[name] || []).filter((p) => Array.isArray(p) && p.length >= 2) }));
  const all = series.flatMap((ser) => ser.pts);
  setText(v.chartCaption, `stage completions per ${bucketS} s, last 10 minutes`);
  const svg = v.chart;
  const kids = [];
  if (all.length === 0) {
    kids.push(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis-label" }, "no completions yet"));
    svg.replaceChildren(...kids);
    v.legend.replaceChildren();
    return;
  }
  const tMin = Math.min(...all.map((p) => p[0]));
  let tMax = Math.max(...all.map((p) => p[0]));
  if (tMax <= tMin) tMax = tMin + bucketS;
  const yMax = niceMax(Math.max(...all.map((p) => Number(p[1]) || 0)));
  const x = (t) => PAD.l + ((t - tMin) / (tMax - tMin)) * (W - PAD.l - PAD.r);
  const y = (c) => H - PAD.b - (c / yMax) * (H - PAD.t - PAD.b);

  // grid + y labels
  for (const frac of [0, 0.5, 1]) {
    const yy = y(yMax * frac);
    kids.push(s("line", { x1: PAD.l, x2: W - PAD.r, y1: yy, y2: yy, class: frac === 0 ? "axis" : "gridline" }));
    kids.push(s("text", { x: PAD.l - 4, y: yy + 3, "text-anchor": "end", class: "axis-label" }, fmtInt(yMax * frac)));
  }
  // x labels (clock times)
  const ticks = 5;
  for (let i = 0; i <= ticks; i++) {
    const t = tMin + ((tMax - tMin) * i) / ticks;
    const d = new Date(t * 1000);
    const label = `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
    kids.push(s("text", { x: x(t), y: H - 5, "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle", class: "axis-label" }, label));
  }
  // one line per stage
  for (const ser of series) {
    if (ser.pts.length === 0) continue;
    const d = ser.pts.map((p) => `${x(p[0]).toFixed(1)},${y(Number(p[1]) || 0).toFixed(1)}`).join(" ");
    kids.push(s("polyline", { points: d, class: `series stage-${ser.name}` }, s("title", null, ser.name)));
  }
  svg.replaceChildren(...kids);

  // legend with totals and last bucket
  v.legend.replaceChildren(
    ...series.map((ser) => {
      const total = ser.pts.reduce((a, p) => a + (Number(p[1]) || 0), 0);
      const last = ser.pts.length ? Number(ser.pts[ser.pts.length - 1][1]) || 0 : 0;
      return h("span", { class: "legend-item" }, h("span", { class: `swatch stage-${ser.name}` }), h("b", null, ser.name), ` ${fmtInt(total)} total · last ${fmtInt(last)}`);
    }),
  );
}

// ---- jobs by status ---------------------------------------------------------------------------

function updateStatusCounts(v, jobs) {
  const names = orderedKeys(jobs, STATUSES);
  for (const st of STATUSES) if (!names.includes(st)) names.push(st);
  let total = 0;
  for (const name of names) {
    const raw = jobs[name];
    if (raw !== undefined && typeof raw !== "number") continue; // skip non-count fields
    const n = Number(raw) || 0;
    total += n;
    let item = v.statusItems.get(name);
    if (!item) {
      item = { count: h("span", { class: "count", "data-testid": `status-count-${name}` }) };
      item.a = h("a", { class: "status-count", href: `#/jobs?status=${encodeURIComponent(name)}`, title: `list ${name} jobs` }, statusBadge(name), item.count);
      v.statusItems.set(name, item);
      v.statusList.append(item.a);
    }
    setText(item.count, n);
    item.a.classList.toggle("zero", n === 0);
  }
  setText(v.jobsTotal, `${fmtInt(total)} jobs in total`);
}

// ---- backends ---------------------------------------------------------------------------------

function updateBackends(v, backends, paused) {
  v.pausedModels.hidden = paused.length === 0;
  if (paused.length) setText(v.pausedModels, `paused models: ${paused.map((m) => (typeof m === "string" ? m : JSON.stringify(m))).join(", ")}`);

  const seen = new Set();
  backends.forEach((b, i) => {
    const id = String(b.id ?? i);
    seen.add(id);
    let row = v.backendRows.get(id);
    if (!row) {
      row = { cells: {} };
      const c = row.cells;
      for (const k of ["id", "model", "kind", "url", "policy", "load", "state", "served", "failures", "error"]) {
        c[k] = h("td", { class: ["policy", "served", "failures"].includes(k) ? "num" : k === "url" ? "clip" : k === "error" ? "clip error" : k === "id" ? "id" : null });
      }
      row.tr = h("tr", { "data-testid": "backend-row", "data-backend-id": id }, Object.values(c));
      v.backendRows.set(id, row);
    }
    v.backendBody.append(row.tr); // keeps server order; moving an existing node is cheap
    fillBackend(row.cells, b, id);
  });
  for (const [id, row] of v.backendRows) {
    if (!seen.has(id)) {
      row.tr.remove();
      v.backendRows.delete(id);
    }
  }
  if (backends.length === 0) {
    if (!v.noBackends) v.noBackends = h("tr", null, h("td", { colspan: 10, class: "muted" }, "no backends registered"));
    v.backendBody.append(v.noBackends);
  } else if (v.noBackends) {
    v.noBackends.remove();
  }
}

function fillBackend(c, b, id) {
  setText(c.id, id);
  setText(c.model, b.model ?? "—");
  setText(c.kind, b.kind ?? "—");
  setText(c.url, b.url ?? "—");
  c.url.title = b.url ?? "";
  setText(c.policy, b.policy_version === null || b.policy_version === undefined ? "—" : `v${b.policy_version}`);
  const inFlight = Number(b.in_flight) || 0;
  const max = b.max_concurrency;
  const loadKey = `${inFlight}/${max}`;
  if (c.load.dataset.key !== loadKey) {
    c.load.dataset.key = loadKey;
    const frac = max ? Math.min(1, inFlight / max) : 0;
    fill(c.load,
      h("span", { class: "num-inline" }, max ? `${inFlight} / ${max}` : String(inFlight)),
      max ? h("span", { class: "minibar small" }, h("span", { class: "fill stage-run", style: { width: `${(frac * 100).toFixed(1)}%` } })) : null,
    );
  }
  const stateKey = `${b.healthy}|${b.draining}|${b.paused}`;
  if (c.state.dataset.key !== stateKey) {
    c.state.dataset.key = stateKey;
    fill(c.state,
      b.healthy === false ? h("span", { class: "badge bad" }, "unhealthy") : h("span", { class: "badge good" }, "healthy"),
      b.draining ? h("span", { class: "badge warn-badge" }, "draining") : null,
      b.paused ? h("span", { class: "badge paused" }, "paused") : null,
    );
  }
  setText(c.served, fmtInt(b.served ?? 0));
  setText(c.failures, fmtInt(b.failures ?? 0));
  c.failures.classList.toggle("bad-text", (Number(b.failures) || 0) > 0);
  setText(c.error, b.last_error ?? "");
  c.error.title = b.last_error ?? "";
}
