// evaluation.js — a job's evaluation as rollserve's evaluators write it: per-test statuses for
// swe / swebench (fail_to_pass, pass_to_pass) and code (the judge's tests), the answer against the
// reference for math and lookup, the raw JSON for anything else.

import { card, fmtReward, h, longText, pretty, rawJSON, TERMINAL } from "./dom.js";
import { rewardClass } from "./jobs.js";

// ---- evaluation -------------------------------------------------------------------------------

export function renderEvaluation(t) {
  const ev = t.evaluation;
  const kind = String(t.kind || "");
  let body;
  if (ev === null || ev === undefined || (typeof ev === "object" && Object.keys(ev).length === 0)) {
    body = h("p", { class: "muted" }, TERMINAL.has(t.status) ? "no evaluation" : "not evaluated yet");
  } else if (typeof ev !== "object") {
    body = h("pre", { class: "json" }, pretty(ev));
  } else if (Array.isArray(ev.tests) || kind === "code") {
    body = evalCode(ev);
  } else if (kind === "swe" || kind === "swebench" || ev.fail_to_pass || ev.pass_to_pass) {
    body = evalSwe(ev);
  } else if ("expected" in ev) {
    body = evalAnswer(ev);
  } else {
    body = h("pre", { class: "json" }, pretty(ev));
  }
  return card(
    "Evaluation",
    h(
      "div",
      { "data-testid": "evaluation" },
      h("div", { class: "kv-row" }, h("span", { class: "kv" }, h("span", { class: "k" }, "reward"), h("span", { class: `v reward big ${rewardClass(t.reward)}` }, fmtReward(t.reward))), h("span", { class: "kv" }, h("span", { class: "k" }, "exit reason"), h("span", { class: "v" }, t.exit_reason ?? "—"))),
      ev && ev.reason ? h("p", { class: "bad-text", "data-testid": "evaluation-reason" }, String(ev.reason)) : null,
      body,
      ev !== null && ev !== undefined ? rawJSON("raw evaluation JSON", ev) : null,
    ),
  );
}

// A test's status as rollserve's evaluators and the SWE-bench harness write it.
function testStatus(value) {
  const st = String(value).toUpperCase();
  if (st === "PASSED" || st === "PASS" || st === "XFAIL") return "PASSED";
  if (st === "SKIPPED") return "SKIPPED";
  if (st === "ERROR") return "ERROR";
  return st === "FAILED" || st === "FAIL" ? "FAILED" : st;
}

const TEST_CLS = { PASSED: "good", FAILED: "bad", ERROR: "bad", MISSING: "bad", SKIPPED: "muted-badge" };

function testTable(rows) {
  const counts = {};
  for (const r of rows) counts[r.st] = (counts[r.st] || 0) + 1;
  return [
    h("div", { class: "test-summary" }, Object.entries(counts).map(([st, n]) => h("span", { class: `badge ${TEST_CLS[st] || "muted-badge"}` }, `${n} ${st.toLowerCase()}`))),
    h(
      "table",
      { class: "grid tests" },
      h("thead", null, h("tr", null, h("th", null, "set"), h("th", null, "test"), h("th", null, "result"), h("th", null, "note"))),
      h(
        "tbody",
        null,
        rows.map((r) =>
          h(
            "tr",
            { class: `test-row t-${r.st.toLowerCase()}`, "data-testid": "test-row", "data-test": r.name, "data-outcome": r.st },
            h("td", { class: "muted small" }, r.group),
            h("td", { class: "mono" }, r.name),
            h("td", null, h("span", { class: `badge ${TEST_CLS[r.st] || "muted-badge"}` }, r.st)),
            h("td", { class: "small mono" }, r.note || ""),
          ),
        ),
      ),
    ),
  ];
}

// swe / swebench: fail_to_pass and pass_to_pass map each test to its status.
function evalSwe(ev) {
  const rows = [];
  for (const key of ["fail_to_pass", "pass_to_pass"]) {
    const g = ev[key];
    if (!g || typeof g !== "object") continue;
    if (Array.isArray(g.success) || Array.isArray(g.failure)) {
      for (const n of g.success || []) rows.push({ group: key, name: String(n), st: "PASSED" });
      for (const n of g.failure || []) rows.push({ group: key, name: String(n), st: "FAILED" });
    } else {
      for (const [name, st] of Object.entries(g)) rows.push({ group: key, name, st: testStatus(st) });
    }
  }
  const skip = new Set(["fail_to_pass", "pass_to_pass", "reason", "test_output", "tests_status"]);
  const scalars = Object.entries(ev).filter(([k, v]) => !skip.has(k) && (v === null || typeof v !== "object"));
  return h(
    "div",
    null,
    scalars.length ? h("div", { class: "kv-row" }, scalars.map(([k, v]) => h("span", { class: "kv" }, h("span", { class: "k" }, k), h("span", { class: `v ${v === true ? "good-text" : v === false ? "bad-text" : ""}` }, boolText(v))))) : null,
    rows.length ? testTable(rows) : h("p", { class: "muted" }, "no test results"),
    ev.test_output ? [h("div", { class: "role" }, "test output"), longText(String(ev.test_output), { class: "out" })] : null,
  );
}

function boolText(v) {
  if (v === true) return "✓ yes";
  if (v === false) return "✗ no";
  if (v === null || v === undefined) return "—";
  return String(v);
}

// math, lookup: the answer taken, the reference, and whether they matched.
function evalAnswer(ev) {
  const correct = ev.correct ?? ev.verified;
  return h(
    "div",
    { class: "math-line" },
    "answer ",
    h("code", { "data-testid": "evaluation-answer" }, ev.answer === undefined || ev.answer === null ? "—" : String(ev.answer)),
    ", expected ",
    h("code", null, ev.expected === undefined || ev.expected === null ? "—" : String(ev.expected)),
    ", verified ",
    h("span", { class: correct === true ? "good-text big" : correct === false ? "bad-text big" : "muted" }, correct === true ? "✓" : correct === false ? "✗" : "?"),
    ev.source ? h("span", { class: "muted small" }, ` (from ${ev.source})`) : null,
  );
}

// code: the judge's verdict on each hidden test.
function evalCode(ev) {
  const tests = Array.isArray(ev.tests) ? ev.tests : [];
  const rows = tests.map((t) => ({
    group: ev.style || "test",
    name: String(t.name ?? "?"),
    st: testStatus(t.outcome ?? "?"),
    note: [t.message, t.exit_code !== undefined ? `exit ${t.exit_code}` : null, t.duration_s !== undefined ? `${t.duration_s} s` : null].filter(Boolean).join(" · "),
  }));
  const tails = tests.filter((t) => t.stderr_tail || t.stdout_tail);
  return h(
    "div",
    null,
    h(
      "div",
      { class: "kv-row" },
      h("span", { class: "kv" }, h("span", { class: "k" }, "passed"), h("span", { class: `v ${ev.passed === true ? "good-text" : ev.passed === false ? "bad-text" : ""}` }, boolText(ev.passed))),
      ev.tests_total !== undefined ? h("span", { class: "kv" }, h("span", { class: "k" }, "tests"), h("span", { class: "v" }, `${ev.tests_passed ?? "?"} / ${ev.tests_total}`)) : null,
    ),
    rows.length ? testTable(rows) : null,
    tails.map((t) => [h("div", { class: "role" }, `judge output · ${t.name}`), longText(String(t.stderr_tail || t.stdout_tail), { class: "out err" })]),
  );
}
