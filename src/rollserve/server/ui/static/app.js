// app.js — the router: hash routes map to views; each view gets a fresh root and a ViewContext
// whose timers die with it, so leaving a page stops its polling.

import { getJSON, noteStatus, ViewContext } from "./api.js";
import { h } from "./dom.js";
import { mountFleet } from "./fleet.js";
import { mountJobs } from "./jobs.js";
import { mountGroup } from "./group.js";
import { mountTrajectory } from "./trajectory.js";

// ---- routes -----------------------------------------------------------------------------------

const ROUTES = [
  { re: /^\/?$/, nav: "fleet", title: () => "Fleet", mount: mountFleet },
  { re: /^\/jobs\/?$/, nav: "jobs", title: () => "Jobs", mount: mountJobs },
  { re: /^\/jobs\/(.+)$/, nav: "jobs", title: (m) => `Job ${m[1]}`, mount: mountTrajectory },
  { re: /^\/groups\/(.+)$/, nav: "jobs", title: (m) => `Group ${m[1]}`, mount: mountGroup },
];

let current = null; // the mounted view's ViewContext

function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/";
  const q = raw.indexOf("?");
  const path = q >= 0 ? raw.slice(0, q) : raw;
  const query = new URLSearchParams(q >= 0 ? raw.slice(q + 1) : "");
  return { path, query };
}

function safeDecode(s) {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

function render() {
  const { path, query } = parseHash();
  if (current) current.dispose();
  const main = document.getElementById("main");
  const root = h("div", { class: "view" });
  main.replaceChildren(root);
  window.scrollTo(0, 0);

  for (const r of ROUTES) {
    const m = path.match(r.re);
    if (!m) continue;
    const param = m[1] !== undefined ? safeDecode(m[1]) : null;
    highlightNav(r.nav);
    document.title = `${r.title([m[0], param])} · rollserve`;
    current = new ViewContext();
    r.mount(root, { ctx: current, param, query });
    return;
  }
  current = null;
  highlightNav(null);
  root.append(h("div", { class: "card pad" }, h("h1", null, "Not found"), h("p", null, "No page at ", h("code", null, path), ". "), h("a", { href: "#/" }, "Go to the fleet view")));
}

function highlightNav(name) {
  for (const a of document.querySelectorAll(".nav a")) {
    a.classList.toggle("active", a.dataset.nav === name);
  }
}

// ---- shell ------------------------------------------------------------------------------------

function setupGoto() {
  const form = document.getElementById("goto");
  if (!form) return;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = form.elements.namedItem("job");
    const id = input.value.trim();
    if (id) {
      window.location.hash = `#/jobs/${encodeURIComponent(id)}`;
      input.value = "";
      input.blur();
    }
  });
}

async function loadServiceName() {
  try {
    noteStatus(await getJSON("/v1/status"));
  } catch {
    /* the nav label is cosmetic; the fleet page reports errors */
  }
}

window.addEventListener("hashchange", render);
setupGoto();
render();
loadServiceName();
