// dom.js — building DOM nodes without innerHTML, formatting, and small shared widgets.

// ---- element builders -------------------------------------------------------------------------

function setProps(el, props) {
  if (!props) return;
  for (const [k, v] of Object.entries(props)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = String(v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "value" || k === "checked" || k === "selected") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function appendAll(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c)); // strings become text nodes: always escaped
  }
}

/** h("div", {class: "x", "data-testid": "y", onclick: fn}, child, "text", [more]) */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  appendAll(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** Same as h() for SVG elements. */
export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setProps(el, props);
  appendAll(el, children);
  return el;
}

/** Replace an element's children (same child rules as h(): null/false skipped, strings as text). */
export function fill(el, ...children) {
  el.replaceChildren();
  appendAll(el, children);
  return el;
}

/** Set text only when it changed (avoids needless layout work on polls). */
export function setText(el, text) {
  const t = String(text);
  if (el.textContent !== t) el.textContent = t;
}

// ---- formatting -------------------------------------------------------------------------------

const pad2 = (n) => String(n).padStart(2, "0");

/** Unix seconds → "HH:MM:SS" today, else "MM-DD HH:MM". */
export function fmtTime(unix) {
  if (unix === null || unix === undefined || !Number.isFinite(Number(unix))) return "—";
  const d = new Date(Number(unix) * 1000);
  const now = new Date();
  const hms = `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
  if (d.toDateString() === now.toDateString()) return hms;
  return `${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}

/** Unix seconds → "YYYY-MM-DD HH:MM:SS" local. */
export function fmtDateTime(unix) {
  if (unix === null || unix === undefined || !Number.isFinite(Number(unix))) return "—";
  const d = new Date(Number(unix) * 1000);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(
    d.getMinutes(),
  )}:${pad2(d.getSeconds())}`;
}

/** A Date → "HH:MM:SS". */
export function clock(d = new Date()) {
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

/** Seconds → "0.42 s", "12.3 s", "4m 05s", "2h 03m". */
export function fmtSecs(sec) {
  if (sec === null || sec === undefined || !Number.isFinite(Number(sec))) return "—";
  const v = Number(sec);
  if (v < 10) return `${v.toFixed(2)} s`;
  if (v < 60) return `${v.toFixed(1)} s`;
  if (v < 3600) return `${Math.floor(v / 60)}m ${pad2(Math.floor(v % 60))}s`;
  return `${Math.floor(v / 3600)}h ${pad2(Math.floor((v % 3600) / 60))}m`;
}

/** 1234567 → "1,234,567". */
export function fmtInt(n) {
  if (n === null || n === undefined || !Number.isFinite(Number(n))) return "—";
  return Number(n).toLocaleString("en-US");
}

/** A reward: up to 3 decimals, "—" when missing. */
export function fmtReward(r) {
  if (r === null || r === undefined || !Number.isFinite(Number(r))) return "—";
  const v = Number(r);
  return Number.isInteger(v) ? v.toFixed(1) : String(Math.round(v * 1000) / 1000);
}

export function fmtNum(x, digits = 3) {
  if (x === null || x === undefined || !Number.isFinite(Number(x))) return "—";
  return String(Math.round(Number(x) * 10 ** digits) / 10 ** digits);
}

/** Sum of the numeric values of a timing object, or null. */
export function totalTiming(timing) {
  if (!timing) return null;
  let sum = 0;
  let any = false;
  for (const v of Object.values(timing)) {
    if (typeof v === "number" && Number.isFinite(v)) {
      sum += v;
      any = true;
    }
  }
  return any ? sum : null;
}

/** JSON pretty-printed, tolerant of anything. */
export function pretty(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

// ---- statuses ---------------------------------------------------------------------------------

export const STATUSES = ["queued", "initializing", "running", "evaluating", "completed", "failed", "cancelled", "stale"];
export const TERMINAL = new Set(["completed", "failed", "cancelled", "stale"]);
export const EXIT_REASONS = ["submitted", "max_turns", "max_tokens", "timeout", "agent_error"];
export const STAGES = ["init", "run", "eval"];

/** A coloured status badge; colours live in app.css under .st-<status>. */
export function statusBadge(status) {
  const st = String(status || "unknown");
  return h("span", { class: `badge st st-${st.replace(/[^a-z_]/gi, "")}` }, st);
}

// ---- widgets ----------------------------------------------------------------------------------

export const LONG_TEXT = 4000;
const HEAD = 2000;
const TAIL = 1500;

/**
 * A <pre> for possibly long text: above LONG_TEXT characters it shows head and tail with a
 * "show all" button in between.
 */
export function longText(text, props = {}) {
  const str = text === null || text === undefined ? "" : String(text);
  const pre = h("pre", props);
  if (str.length <= LONG_TEXT) {
    pre.append(str);
    return pre;
  }
  const hidden = str.length - HEAD - TAIL;
  const btn = h("button", { class: "btn small show-all", type: "button" }, `show all (${fmtInt(hidden)} more chars)`);
  const gap = h("span", { class: "elided" }, `\n… ${fmtInt(hidden)} characters hidden … `, btn, "\n");
  btn.addEventListener("click", () => pre.replaceChildren(str));
  pre.append(str.slice(0, HEAD), gap, str.slice(str.length - TAIL));
  return pre;
}

/** A <details> with pretty JSON inside. */
export function rawJSON(label, value, open = false) {
  return h("details", { class: "raw", open }, h("summary", null, label), h("pre", { class: "json" }, pretty(value)));
}

/** A card: titled box. */
export function card(title, ...children) {
  return h("section", { class: "card" }, title ? h("h2", null, title) : null, ...children);
}

/** "key value" pairs in a compact definition row. */
export function kv(label, value, props = {}) {
  return h("span", { class: "kv", ...props }, h("span", { class: "k" }, label), h("span", { class: "v" }, value));
}
