// jobs.js — the jobs table: filters mirrored into the hash, sortable headers, paging, and a
// quiet auto-refresh every 3 s that only re-renders when the answer changed.

import { ApiError, getJSON } from "./api.js";
import { EXIT_REASONS, fmtReward, fmtSecs, fmtDateTime, fmtTime, h, setText, STATUSES, statusBadge, totalTiming } from "./dom.js";

const REFRESH_MS = 3000;
const DEBOUNCE_MS = 250;
const DEFAULTS = { sort: "created", order: "desc", offset: 0, limit: 50 };
const SORTABLE = ["created", "updated", "finished", "reward", "policy_version"];
const MULTI = ["status", "exit_reason"];
const SINGLE = ["kind", "group_id", "reward_min", "reward_max", "policy_version_min", "policy_version_max", "created_after", "created_before"];

// ---- state <-> query strings ------------------------------------------------------------------

function stateFromQuery(q) {
  const st = {};
  for (const k of MULTI) st[k] = q.getAll(k).filter(Boolean);
  for (const k of SINGLE) st[k] = q.get(k) || "";
  st.sort = SORTABLE.includes(q.get("sort")) ? q.get("sort") : DEFAULTS.sort;
  st.order = q.get("order") === "asc" ? "asc" : DEFAULTS.order;
  st.offset = Math.max(0, parseInt(q.get("offset"), 10) || 0);
  const lim = parseInt(q.get("limit"), 10);
  st.limit = lim >= 1 && lim <= 500 ? lim : DEFAULTS.limit;
  return st;
}

/** The query string; `full` adds sort/order/offset/limit even when they are the defaults. */
function queryFromState(st, full) {
  const q = new URLSearchParams();
  for (const k of MULTI) for (const v of st[k]) q.append(k, v);
  for (const k of SINGLE) if (st[k] !== "") q.set(k, st[k]);
  for (const k of ["sort", "order", "offset", "limit"]) {
    if (full || st[k] !== DEFAULTS[k]) q.set(k, String(st[k]));
  }
  return q.toString();
}

// datetime-local "YYYY-MM-DDTHH:MM[:SS]" (local time) <-> unix seconds
function localToUnix(value) {
  if (!value) return "";
  const t = new Date(value).getTime();
  return Number.isFinite(t) ? String(t / 1000) : "";
}

function unixToLocal(unix) {
  const n = Number(unix);
  if (unix === "" || !Number.isFinite(n)) return "";
  const d = new Date(n * 1000);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

// ---- view -------------------------------------------------------------------------------------

export function mountJobs(root, { ctx, query }) {
  const st = stateFromQuery(query);
  const ui = buildUI(st);
  root.append(ui.page);

  let seq = 0; // answers to older requests are dropped
  let lastKey = null;

  async function load() {
    const my = ++seq;
    const url = `/v1/jobs?${queryFromState(st, true)}`;
    try {
      const data = await getJSON(url);
      if (!ctx.alive || my !== seq) return;
      ui.error.hidden = true;
      const key = JSON.stringify(data);
      if (key !== lastKey) {
        lastKey = key;
        renderPage(ui, st, data);
      }
    } catch (err) {
      if (!ctx.alive || my !== seq) return;
      lastKey = null;
      showError(ui, err);
    }
    ui.page.setAttribute("data-ready", "1");
  }

  /** A filter/sort/page change: mirror into the hash (no reload, no hashchange) and fetch. */
  function changed(resetOffset = true) {
    if (resetOffset) st.offset = 0;
    const qs = queryFromState(st, false);
    history.replaceState(null, "", `#/jobs${qs ? `?${qs}` : ""}`);
    load();
  }

  wireFilters(ui, st, ctx, changed);
  wireSortAndPaging(ui, st, changed);
  ctx.poll(load, REFRESH_MS);
}

function showError(ui, err) {
  const msg = err instanceof ApiError && err.status === 422 ? err.message : `could not load jobs: ${err.message}`;
  setText(ui.error, msg);
  if (err instanceof ApiError && err.details) ui.error.title = JSON.stringify(err.details);
  ui.error.hidden = false;
  ui.tbody.replaceChildren(h("tr", null, h("td", { colspan: COLS.length, class: "muted empty" }, "no results (see the error above)")));
  setText(ui.total, "—");
  setText(ui.bottomTotal, "");
  ui.total.setAttribute("data-total", "");
  ui.prev.disabled = true;
  ui.next.disabled = true;
}

// ---- building the page ------------------------------------------------------------------------

const COLS = [
  { key: "job_id", label: "job" },
  { key: "group_id", label: "group" },
  { key: "kind", label: "kind" },
  { key: "task_id", label: "task" },
  { key: "status", label: "status" },
  { key: "reward", label: "reward", sort: "reward", num: true },
  { key: "exit_reason", label: "exit reason" },
  { key: "policy_version", label: "policy", sort: "policy_version", num: true },
  { key: "turns", label: "turns", num: true },
  { key: "attempts", label: "att.", num: true, title: "attempts" },
  { key: "created", label: "created", sort: "created" },
  { key: "updated", label: "updated", sort: "updated" },
  { key: "finished", label: "finished", sort: "finished" },
  { key: "duration", label: "duration", num: true, title: "queued + init + run + eval" },
];

function selectWith(testid, values, anyLabel, selected) {
  const sel = h("select", { "data-testid": testid }, h("option", { value: "" }, anyLabel), values.map((v) => h("option", { value: v }, v)));
  if (selected.length > 1) {
    // a link with several values: keep them, shown as one extra option
    sel.append(h("option", { value: selected.join(",") }, selected.join(" + ")));
    sel.value = selected.join(",");
  } else {
    sel.value = selected[0] || "";
  }
  return sel;
}

function buildUI(st) {
  const ui = {};
  ui.status = selectWith("filter-status", STATUSES, "any status", st.status);
  ui.exit = selectWith("filter-exit-reason", EXIT_REASONS, "any exit reason", st.exit_reason);
  ui.kind = h("input", { type: "text", "data-testid": "filter-kind", placeholder: "kind", value: st.kind, size: 8 });
  ui.group = h("input", { type: "text", "data-testid": "filter-group", placeholder: "group id", value: st.group_id, size: 12 });
  const num = (testid, ph, val, step) => h("input", { type: "number", "data-testid": testid, placeholder: ph, value: val, step, class: "numin" });
  ui.rmin = num("filter-reward-min", "min", st.reward_min, "any");
  ui.rmax = num("filter-reward-max", "max", st.reward_max, "any");
  ui.vmin = num("filter-version-min", "min", st.policy_version_min, "1");
  ui.vmax = num("filter-version-max", "max", st.policy_version_max, "1");
  ui.after = h("input", { type: "datetime-local", "data-testid": "filter-created-after", value: unixToLocal(st.created_after) });
  ui.before = h("input", { type: "datetime-local", "data-testid": "filter-created-before", value: unixToLocal(st.created_before) });
  ui.clear = h("button", { type: "button", class: "btn" }, "clear");
  ui.error = h("div", { class: "error-inline", "data-testid": "jobs-error", role: "alert", hidden: true });

  const field = (label, ...inputs) => h("label", { class: "field" }, h("span", { class: "flabel" }, label), h("span", { class: "finputs" }, inputs));
  const bar = h(
    "div",
    { class: "filters" },
    field("status", ui.status),
    field("kind", ui.kind),
    field("group", ui.group),
    field("exit reason", ui.exit),
    field("reward", ui.rmin, "–", ui.rmax),
    field("policy version", ui.vmin, "–", ui.vmax),
    field("created after", ui.after),
    field("created before", ui.before),
    h("span", { class: "field end" }, ui.clear),
  );

  ui.sortHeads = new Map();
  const headRow = h(
    "tr",
    null,
    COLS.map((c) => {
      const th = h("th", { class: c.num ? "num" : null, title: c.title || null }, c.label);
      if (c.sort) {
        th.classList.add("sortable");
        th.setAttribute("data-testid", `sort-${c.sort}`);
        th.setAttribute("role", "button");
        th.setAttribute("tabindex", "0");
        th.append(h("span", { class: "arrow" }));
        ui.sortHeads.set(c.sort, th);
      }
      return th;
    }),
  );
  ui.tbody = h("tbody", null, h("tr", null, h("td", { colspan: COLS.length, class: "muted empty" }, "loading…")));
  ui.total = h("span", { class: "total", "data-testid": "jobs-total" }, "…");
  ui.prev = h("button", { type: "button", class: "btn", "data-testid": "prev-page", disabled: true }, "‹ Prev");
  ui.next = h("button", { type: "button", class: "btn", "data-testid": "next-page", disabled: true }, "Next ›");
  const pager = h("div", { class: "pager" }, ui.total, ui.prev, ui.next);

  ui.page = h(
    "div",
    { class: "page jobs", "data-testid": "jobs" },
    h("div", { class: "page-head" }, h("h1", null, "Jobs"), h("span", { class: "spacer" }), pager),
    bar,
    ui.error,
    h("div", { class: "table-wrap" }, h("table", { class: "grid jobs-table" }, h("thead", null, headRow), ui.tbody)),
    h("div", { class: "pager bottom" }, ui.total.cloneNode(false)),
  );
  ui.bottomTotal = ui.page.querySelector(".pager.bottom .total");
  ui.bottomTotal.removeAttribute("data-testid");
  showSort(ui, st);
  return ui;
}

// ---- wiring -----------------------------------------------------------------------------------

function wireFilters(ui, st, ctx, changed) {
  const multi = (sel, key) =>
    sel.addEventListener("change", () => {
      st[key] = sel.value ? sel.value.split(",") : [];
      changed();
    });
  multi(ui.status, "status");
  multi(ui.exit, "exit_reason");

  const text = (input, key) => {
    const apply = ctx.debounce(() => {
      const v = input.value.trim();
      if (v === st[key]) return;
      st[key] = v;
      changed();
    }, DEBOUNCE_MS);
    input.addEventListener("input", apply);
    input.addEventListener("change", apply);
  };
  text(ui.kind, "kind");
  text(ui.group, "group_id");
  text(ui.rmin, "reward_min");
  text(ui.rmax, "reward_max");
  text(ui.vmin, "policy_version_min");
  text(ui.vmax, "policy_version_max");

  const when = (input, key) =>
    input.addEventListener("change", () => {
      st[key] = localToUnix(input.value);
      changed();
    });
  when(ui.after, "created_after");
  when(ui.before, "created_before");

  ui.clear.addEventListener("click", () => {
    for (const k of MULTI) st[k] = [];
    for (const k of SINGLE) st[k] = "";
    for (const el of [ui.kind, ui.group, ui.rmin, ui.rmax, ui.vmin, ui.vmax, ui.after, ui.before, ui.status, ui.exit]) el.value = "";
    changed();
  });
}

function wireSortAndPaging(ui, st, changed) {
  for (const [field, th] of ui.sortHeads) {
    const go = () => {
      if (st.sort === field) st.order = st.order === "asc" ? "desc" : "asc";
      else {
        st.sort = field;
        st.order = "desc";
      }
      showSort(ui, st);
      changed();
    };
    th.addEventListener("click", go);
    th.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        go();
      }
    });
  }
  ui.prev.addEventListener("click", () => {
    st.offset = Math.max(0, st.offset - st.limit);
    changed(false);
  });
  ui.next.addEventListener("click", () => {
    st.offset += st.limit;
    changed(false);
  });
}

function showSort(ui, st) {
  for (const [field, th] of ui.sortHeads) {
    const on = st.sort === field;
    th.classList.toggle("sorted", on);
    th.setAttribute("aria-sort", on ? (st.order === "asc" ? "ascending" : "descending") : "none");
    setText(th.querySelector(".arrow"), on ? (st.order === "asc" ? " ▲" : " ▼") : "");
  }
}

// ---- rendering a page of jobs -----------------------------------------------------------------

function renderPage(ui, st, data) {
  const jobs = Array.isArray(data.jobs) ? data.jobs : [];
  const total = Number(data.total) || 0;
  const offset = Number(data.offset ?? st.offset) || 0;
  const frag = document.createDocumentFragment();
  for (const j of jobs) frag.append(jobRow(j));
  if (jobs.length === 0) {
    frag.append(h("tr", null, h("td", { colspan: COLS.length, class: "muted empty" }, total > 0 ? "no jobs on this page" : "no jobs match these filters")));
  }
  ui.tbody.replaceChildren(frag);

  const text = jobs.length ? `${offset + 1}–${offset + jobs.length} of ${total}` : `0 of ${total}`;
  setText(ui.total, text);
  setText(ui.bottomTotal, text);
  ui.total.setAttribute("data-total", String(total));
  ui.prev.disabled = offset <= 0;
  ui.next.disabled = offset + jobs.length >= total;
}

function opt(v, f = String) {
  return v === null || v === undefined || v === "" ? h("span", { class: "muted" }, "—") : f(v);
}

function jobRow(j) {
  const id = String(j.job_id);
  const dur = totalTiming(j.timing);
  return h(
    "tr",
    { "data-testid": "job-row", "data-job-id": id, "data-status": j.status ?? "", "data-reward": j.reward ?? "" },
    h("td", { class: "mono clip id" }, h("a", { href: `#/jobs/${encodeURIComponent(id)}`, title: id }, id)),
    h("td", { class: "mono clip" }, j.group_id ? h("a", { href: `#/groups/${encodeURIComponent(j.group_id)}`, title: j.group_id }, j.group_id) : opt(null)),
    h("td", null, opt(j.kind)),
    h("td", { class: "clip", title: j.task_id ?? "" }, opt(j.task_id)),
    h("td", { class: "nowrap" }, statusBadge(j.status), j.error_code ? h("span", { class: "errcode", title: "error code" }, j.error_code) : null),
    h("td", { class: `num reward ${rewardClass(j.reward)}` }, fmtReward(j.reward)),
    h("td", null, opt(j.exit_reason)),
    h("td", { class: "num" }, opt(j.policy_version, (v) => `v${v}`)),
    h("td", { class: "num" }, opt(j.turns)),
    h("td", { class: `num${(j.attempts || 0) > 1 ? " warn-text" : ""}` }, opt(j.attempts)),
    h("td", { class: "time", title: fmtDateTime(j.created) }, fmtTime(j.created)),
    h("td", { class: "time", title: fmtDateTime(j.updated) }, fmtTime(j.updated)),
    h("td", { class: "time", title: fmtDateTime(j.finished) }, j.finished ? fmtTime(j.finished) : opt(null)),
    h("td", { class: "num", title: timingTitle(j.timing) }, dur === null ? opt(null) : fmtSecs(dur)),
  );
}

export function rewardClass(r) {
  if (r === null || r === undefined) return "";
  return Number(r) > 0 ? "pos" : Number(r) < 0 ? "neg" : "zero";
}

function timingTitle(t) {
  if (!t) return "";
  return ["queued_s", "init_s", "run_s", "eval_s"]
    .filter((k) => typeof t[k] === "number")
    .map((k) => `${k.replace("_s", "")} ${fmtSecs(t[k])}`)
    .join(" · ");
}
