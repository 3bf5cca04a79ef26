// trajectory.js — one job's trajectory: header, error, stage timeline, the agent process, prelude,
// turns (segments marked), evaluation, patch and tokens (segment by segment). Polled every second
// while the job is not terminal; each section re-renders only when its own data changed, and turn
// cards are keyed by index, so open <details> and scroll stay.

import { ApiError, getJSON } from "./api.js";
import { card, fmtDateTime, fmtInt, fmtReward, fmtSecs, h, longText, pretty, statusBadge, TERMINAL, totalTiming } from "./dom.js";
import { rewardClass } from "./jobs.js";
import { renderEvaluation } from "./evaluation.js";
import { tokenView } from "./tokens.js";

const POLL_MS = 1000;
const TURNS_PER_PAGE = 50;
const SEGMENT_NOTE = "rollserve.segment"; // the note the gateway records where a token segment begins

export function mountTrajectory(root, { ctx, param }) {
  const jobId = param;
  const page = h("div", { class: "page trajectory", "data-testid": "trajectory", "data-job-id": jobId });
  root.append(page);
  const view = new TrajectoryView(page, jobId);
  let first = true;

  ctx.poll(async () => {
    let t;
    try {
      t = await getJSON(`/v1/jobs/${encodeURIComponent(jobId)}/trajectory`);
    } catch (err) {
      if (!ctx.alive) return false;
      if (first) {
        const what = err instanceof ApiError && err.status === 404 ? `no job ${jobId}` : `could not load job ${jobId}: ${err.message}`;
        page.replaceChildren(h("div", { class: "error-block" }, what));
        page.setAttribute("data-ready", "1");
        return err.status !== 404; // retry transient errors
      }
      view.showPollError(err);
      return true;
    }
    if (!ctx.alive) return false;
    first = false;
    view.update(t);
    page.setAttribute("data-ready", "1");
    return !TERMINAL.has(t.status);
  }, POLL_MS);
}

// ---- the view: sections keyed by their data ---------------------------------------------------

class TrajectoryView {
  constructor(page, jobId) {
    this.page = page;
    this.jobId = jobId;
    this.sections = {};
    this.keys = {};
    for (const name of ["header", "error", "timeline", "agent", "prelude", "turns", "evaluation", "patch", "tokens"]) {
      this.sections[name] = h("div", { class: `sec sec-${name}` });
      page.append(this.sections[name]);
    }
    this.pollError = h("div", { class: "notice warn-note", hidden: true });
    page.prepend(this.pollError);
    this.turnPage = 0;
    this.turnCards = new Map(); // index -> {key, el}
  }

  showPollError(err) {
    this.pollError.hidden = false;
    this.pollError.textContent = `refresh failed: ${err.message} (retrying)`;
  }

  /** Re-render section `name` with `fn()` when `data` (as JSON) changed. */
  section(name, data, fn) {
    const key = JSON.stringify(data ?? null);
    if (this.keys[name] === key) return;
    this.keys[name] = key;
    this.sections[name].replaceChildren(...[fn()].flat().filter(Boolean));
  }

  update(t) {
    this.lastT = t; // for turn paging clicks
    this.pollError.hidden = true;
    this.page.setAttribute("data-status", t.status ?? "");
    const headerData = { ...t, prelude: undefined, turns: undefined, tokens: undefined, token_text: undefined, segments: undefined, segment_text: undefined, agent_run: undefined, evaluation: undefined, patch: undefined, nturns: (t.turns || []).length };
    this.section("header", headerData, () => renderHeader(t));
    this.section("error", t.error, () => (t.error ? renderError(t.error) : null));
    this.section("timeline", [t.timing, t.status], () => renderTimeline(t.timing, t.status));
    this.section("agent", t.agent_run, () => (t.agent_run ? renderAgentRun(t.agent_run) : null));
    this.section("prelude", t.prelude, () => renderPrelude(t.prelude || []));
    this.updateTurns(t);
    this.section("evaluation", [t.evaluation, t.reward, t.kind, t.status], () => renderEvaluation(t));
    this.section("patch", t.patch, () => (t.patch ? renderPatch(t.patch) : null));
    this.section("tokens", [t.tokens, t.token_text, t.segments, t.segment_text], () => renderTokens(t));
  }

  // ---- turns, paged, keyed by index -----------------------------------------------------------

  updateTurns(t) {
    const turns = t.turns || [];
    const sec = this.sections.turns;
    const pages = Math.max(1, Math.ceil(turns.length / TURNS_PER_PAGE));
    if (!this.turnsBox) {
      this.turnsHead = h("h2", null);
      this.turnsPager = h("div", { class: "tok-pager" });
      this.turnsList = h("div", { class: "turns" });
      this.turnsBox = card(null, h("div", { class: "card-head" }, this.turnsHead, this.turnsPager), this.turnsList, (this.turnsPagerBottom = h("div", { class: "tok-pager" })));
      sec.append(this.turnsBox);
      this.lastPages = pages;
    }
    // while following a live job on its last page, stay on the last page as turns arrive
    if (this.turnPage === this.lastPages - 1) this.turnPage = pages - 1;
    this.turnPage = Math.min(this.turnPage, pages - 1);
    this.lastPages = pages;
    this.turnsHead.textContent = `Turns (${turns.length})`;
    if (turns.length === 0) {
      this.turnsList.replaceChildren(h("p", { class: "muted" }, t.live || !TERMINAL.has(t.status) ? "no turns yet…" : "no turns"));
      this.turnCards.clear();
      this.renderTurnPager(turns.length, pages);
      return;
    }
    const start = this.turnPage * TURNS_PER_PAGE;
    const visible = turns.slice(start, start + TURNS_PER_PAGE);
    const wanted = new Set();
    let prevEl = null;
    for (const turn of visible) {
      const idx = turn.index;
      wanted.add(idx);
      const key = JSON.stringify(turn);
      let entry = this.turnCards.get(idx);
      if (!entry || entry.key !== key) {
        const el = renderTurn(turn);
        if (entry) entry.el.replaceWith(el);
        entry = { key, el };
        this.turnCards.set(idx, entry);
      }
      // keep DOM order = turn order
      const want = prevEl ? prevEl.nextSibling : this.turnsList.firstChild;
      if (want !== entry.el) this.turnsList.insertBefore(entry.el, want);
      prevEl = entry.el;
    }
    for (const [idx, entry] of this.turnCards) {
      if (!wanted.has(idx)) {
        entry.el.remove();
        this.turnCards.delete(idx);
      }
    }
    const keep = new Set([...this.turnCards.values()].map((e) => e.el));
    for (const node of [...this.turnsList.childNodes]) if (!keep.has(node)) node.remove();
    if (t.live) {
      if (!this.liveTail) this.liveTail = h("div", { class: "live-tail muted" }, h("span", { class: "live-dot" }), " waiting for the next turn…");
      this.turnsList.append(this.liveTail);
    }
    this.renderTurnPager(turns.length, pages);
  }

  renderTurnPager(n, pages) {
    const make = () => {
      if (pages <= 1) return [];
      const go = (p) => () => {
        this.turnPage = p;
        this.updateTurns(this.lastT);
        this.turnsBox.scrollIntoView({ block: "start" });
      };
      const start = this.turnPage * TURNS_PER_PAGE;
      return [
        h("button", { type: "button", class: "btn small", disabled: this.turnPage === 0, onclick: go(this.turnPage - 1) }, "‹ prev"),
        h("button", { type: "button", class: "btn small", disabled: this.turnPage >= pages - 1, onclick: go(this.turnPage + 1) }, "next ›"),
        h("span", { class: "muted small" }, `turns ${start + 1}–${Math.min(n, start + TURNS_PER_PAGE)} of ${n} · page ${this.turnPage + 1} / ${pages}`),
      ];
    };
    this.turnsPager.replaceChildren(...make());
    this.turnsPagerBottom.replaceChildren(...make());
  }
}

// ---- header -----------------------------------------------------------------------------------

function renderHeader(t) {
  const id = String(t.job_id);
  const field = (label, value, props = {}) => h("span", { class: "kv" }, h("span", { class: "k" }, label), h("span", { class: "v", ...props }, value));
  const none = (v) => (v === null || v === undefined || v === "" ? "—" : String(v));
  return h(
    "div",
    { class: "traj-head card" },
    h(
      "div",
      { class: "title-row" },
      h("h1", { class: "mono" }, id),
      statusBadge(t.status),
      t.live ? h("span", { class: "live", "data-testid": "traj-live" }, h("span", { class: "live-dot" }), "live") : null,
      h("span", { class: "spacer" }),
      h("a", { class: "btn", href: `/v1/jobs/${encodeURIComponent(id)}`, download: `${id}.json`, "data-testid": "download-json" }, "Download JSON"),
    ),
    h(
      "div",
      { class: "kv-row" },
      field("reward", fmtReward(t.reward), { "data-testid": "traj-reward", class: `v reward big ${rewardClass(t.reward)}` }),
      field("exit reason", none(t.exit_reason), { "data-testid": "traj-exit-reason" }),
      field("attempts", none(t.attempts), { class: `v${(t.attempts || 0) > 1 ? " warn-text" : ""}` }),
      field("kind", none(t.kind)),
      field("task", none(t.task_id), { class: "v mono" }),
      field("model", none(t.model), { class: "v mono" }),
      field("group", t.group_id ? h("a", { href: `#/groups/${encodeURIComponent(t.group_id)}`, class: "mono" }, t.group_id) : "—"),
      field("turns", String((t.turns || []).length)),
      field("tool errors", none(t.tool_errors), { class: `v${(t.tool_errors || 0) > 0 ? " bad-text" : ""}` }),
      field("created", fmtDateTime(t.created)),
      field("finished", t.finished ? fmtDateTime(t.finished) : "—"),
    ),
  );
}

// ---- the agent process (external agents, harnesses) -------------------------------------------

function renderAgentRun(run) {
  const field = (label, value, props = {}) => h("span", { class: "kv" }, h("span", { class: "k" }, label), h("span", { class: "v", ...props }, value));
  const code = run.exit_code === null || run.exit_code === undefined ? "killed" : String(run.exit_code);
  const codeClass = run.exit_code === 0 ? "good-text" : "bad-text";
  const tail = (label, text) =>
    text ? h("details", { class: "raw", open: true }, h("summary", null, label), longText(text, { class: "out", "data-testid": `agent-${label}` })) : null;
  return card(
    "Agent process",
    h(
      "div",
      { "data-testid": "agent-run" },
      h(
        "div",
        { class: "kv-row" },
        field("exit", code, { class: `v ${codeClass}`, "data-testid": "agent-exit" }),
        run.signal ? field("signal", String(run.signal)) : null,
        run.ended_by ? field("ended by", run.ended_by, { class: "v warn-text" }) : null,
        field("wall", fmtSecs(run.wall_s ?? 0)),
        field("model calls", fmtInt(run.model_calls ?? 0), { "data-testid": "agent-calls" }),
        field("refused", fmtInt(run.refused_calls ?? 0), { class: `v${(run.refused_calls || 0) > 0 ? " bad-text" : ""}` }),
        run.output_truncated ? h("span", { class: "trunc-note" }, "output truncated") : null,
      ),
      tail("stdout", run.stdout_tail),
      tail("stderr", run.stderr_tail),
    ),
  );
}

// ---- tokens, segment by segment ---------------------------------------------------------------

function renderTokens(t) {
  if (!t.tokens) return null;
  const segments = Array.isArray(t.segments) && t.segments.length > 1 ? t.segments : null;
  if (!segments) return card("Tokens", h("div", { "data-testid": "token-view" }, tokenView(t.tokens, t.token_text)));
  const texts = Array.isArray(t.segment_text) ? t.segment_text : [];
  const view = h("div", { "data-testid": "token-view" });
  const why = h("p", { class: "muted small", "data-testid": "segment-why" });
  const buttons = segments.map((seg, i) => h("button", { type: "button", class: "btn small", "data-testid": "segment-pick", "data-segment": String(seg.segment ?? i), onclick: () => show(i) }, `segment ${seg.segment ?? i} · ${fmtInt((seg.turns || []).length)} turn${(seg.turns || []).length === 1 ? "" : "s"}`));
  function show(i) {
    buttons.forEach((b, j) => b.classList.toggle("active", i === j));
    const seg = segments[i];
    view.setAttribute("data-segment", String(seg.segment ?? i));
    why.textContent = `segment ${seg.segment ?? i} began: ${seg.started_by || "the first call"}`;
    view.replaceChildren(tokenView(seg, texts[i]));
  }
  show(segments.length - 1);
  const note = h("p", { class: "small" }, `${segments.length} token segments: the agent rewrote its history, so each segment is its own exact sequence with its own mask.`);
  return card("Tokens", note, h("div", { class: "tok-pager" }, buttons), why, view);
}

// ---- error ------------------------------------------------------------------------------------

function renderError(err) {
  const e = typeof err === "object" && err ? err : { message: String(err) };
  return h(
    "div",
    { class: "error-block", "data-testid": "job-error", role: "alert" },
    h("div", null, h("b", { class: "mono" }, e.code || "error"), e.message ? ": " : "", e.message || ""),
    e.details && Object.keys(e.details).length ? h("pre", { class: "json" }, pretty(e.details)) : null,
  );
}

// ---- stage timeline ---------------------------------------------------------------------------

const TIMELINE = [
  ["queued_s", "queued", "stage-queued"],
  ["init_s", "init", "stage-init"],
  ["run_s", "run", "stage-run"],
  ["eval_s", "eval", "stage-eval"],
];

function renderTimeline(timing, status) {
  const t = timing || {};
  const total = totalTiming(t) || 0;
  const parts = TIMELINE.map(([k, label, cls]) => ({ label, cls, v: typeof t[k] === "number" && t[k] > 0 ? t[k] : 0, known: typeof t[k] === "number" }));
  const bar = h(
    "div",
    { class: "timeline-bar" },
    total > 0
      ? parts
          .filter((p) => p.v > 0)
          .map((p) => {
            const pct = (p.v / total) * 100;
            return h("span", { class: `seg ${p.cls}`, style: { width: `${pct}%` }, title: `${p.label} ${fmtSecs(p.v)}` }, pct > 9 ? `${p.label} ${fmtSecs(p.v)}` : "");
          })
      : h("span", { class: "muted small pad-x" }, TERMINAL.has(status) ? "no timing recorded" : "no timing yet"),
  );
  const legend = h(
    "div",
    { class: "legend" },
    parts.map((p) => h("span", { class: "legend-item" }, h("span", { class: `swatch ${p.cls}` }), `${p.label} `, h("b", null, p.known ? fmtSecs(p.v) : "—"))),
    h("span", { class: "legend-item" }, "total ", h("b", null, fmtSecs(total)), TERMINAL.has(status) ? "" : " so far"),
  );
  return card("Stages", h("div", { "data-testid": "timeline" }, bar, legend));
}

// ---- messages ---------------------------------------------------------------------------------

/** Content of a message as text (strings, or lists of {type:"text", text} parts). */
function messageText(m) {
  const c = m ? m.content : null;
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map((p) => (typeof p === "string" ? p : p && typeof p.text === "string" ? p.text : pretty(p))).join("\n");
  return pretty(c);
}

function renderPrelude(prelude) {
  if (!prelude.length) return null;
  const items = prelude.map((m) => {
    const text = messageText(m);
    if (m.role === "system") {
      return h("details", { class: "msg msg-system" }, h("summary", null, h("span", { class: "role" }, "system"), h("span", { class: "muted small" }, ` ${fmtInt(text.length)} chars`)), longText(text, { class: "text" }));
    }
    return h("div", { class: `msg msg-${m.role}` }, h("div", { class: "role" }, m.role === "user" ? "task" : m.role), longText(text, { class: "text" }));
  });
  return card("Prelude", items);
}

// ---- turns ------------------------------------------------------------------------------------

function turnMeta(turn) {
  const i = turn.info || {};
  const bits = [h("b", null, `turn ${turn.index}`)];
  const add = (x) => bits.push(" · ", x);
  if (i.backend_id) add(`backend ${i.backend_id}`);
  if (i.model) add(`model ${i.model}`);
  if (i.policy_version !== null && i.policy_version !== undefined) add(`policy v${i.policy_version}`);
  if (i.prompt_tokens !== undefined || i.generated_tokens !== undefined) add(`${fmtInt(i.prompt_tokens ?? 0)} → ${fmtInt(i.generated_tokens ?? 0)} tokens`);
  if (typeof i.latency_s === "number") add(fmtSecs(i.latency_s));
  if (i.finish_reason) add(`finish ${i.finish_reason}`);
  if (typeof turn.started_s === "number") add(h("span", { class: "muted" }, `at +${fmtSecs(turn.started_s)}`));
  if (i.truncated) add(h("span", { class: "badge warn-badge" }, "truncated"));
  if (turn.segment !== null && turn.segment !== undefined) add(h("span", { class: "badge", "data-testid": "turn-segment" }, `segment ${turn.segment}`));
  if (turn.mode === "text") add(h("span", { class: "badge warn-badge", title: "the backend had no tokenizer: text passed through" }, "text mode"));
  return bits;
}

function renderTurn(turn) {
  const msgs = turn.messages || [];
  const toolInfo = new Map((turn.tools || []).map((x) => [x.tool_call_id, x]));
  const outputs = new Map();
  for (const m of msgs) if (m.role === "tool" && m.tool_call_id && !outputs.has(m.tool_call_id)) outputs.set(m.tool_call_id, m);
  const used = new Set();
  const el = h(
    "article",
    { class: "turn", "data-testid": "turn", "data-turn": turn.index },
    h("div", { class: "turn-meta" }, turnMeta(turn), turn.info ? h("details", { class: "raw inline" }, h("summary", null, "info"), h("pre", { class: "json" }, pretty(turn.info))) : null),
  );
  for (const m of msgs) {
    if (m.role === "assistant") {
      const text = messageText(m);
      if (text) el.append(longText(text, { class: "assistant text" }));
      for (const call of m.tool_calls || []) {
        el.append(renderToolCall(call));
        const out = outputs.get(call.id);
        if (out) {
          used.add(out);
          el.append(renderToolOutput(out, toolInfo.get(call.id)));
        } else if (toolInfo.has(call.id)) {
          el.append(renderToolOutput({ content: "", tool_call_id: call.id }, toolInfo.get(call.id)));
        } else {
          el.append(h("div", { class: "tool-out pending muted small" }, "no output yet"));
        }
      }
      if (!text && !(m.tool_calls || []).length) el.append(h("div", { class: "muted small" }, "(empty reply)"));
    } else if (m.role === "tool") {
      if (!used.has(m)) el.append(renderToolOutput(m, toolInfo.get(m.tool_call_id)));
    } else if (m.role === "system" && m.name === SEGMENT_NOTE) {
      el.append(h("div", { class: "segment-mark", "data-testid": "segment-mark" }, messageText(m)));
    } else if (m.role === "user") {
      el.append(h("div", { class: "note" }, h("span", { class: "role" }, "note to the model"), longText(messageText(m), { class: "text" })));
    } else {
      el.append(h("div", { class: `msg msg-${m.role}` }, h("div", { class: "role" }, String(m.role)), longText(messageText(m), { class: "text" })));
    }
  }
  return el;
}

function parseArgs(raw) {
  if (raw === null || raw === undefined) return { ok: true, value: {} };
  if (typeof raw === "object") return { ok: true, value: raw };
  try {
    return { ok: true, value: JSON.parse(raw) };
  } catch {
    return { ok: false, value: String(raw) };
  }
}

function renderToolCall(call) {
  const fn = call.function || {};
  const name = fn.name || call.name || "tool";
  const args = parseArgs(fn.arguments ?? call.arguments);
  const box = h("div", { class: "tool-call", "data-testid": "tool-call", "data-tool": name }, h("div", { class: "tool-head" }, h("span", { class: "tool-name" }, name), call.id ? h("span", { class: "muted small mono" }, call.id) : null));
  const v = args.value;
  if (args.ok && v && typeof v === "object" && !Array.isArray(v) && typeof v.command === "string" && (name === "bash" || Object.keys(v).length <= 2)) {
    box.append(longText(v.command, { class: "code cmd" }));
    const rest = { ...v };
    delete rest.command;
    if (Object.keys(rest).length) box.append(h("pre", { class: "json small" }, pretty(rest)));
  } else if (args.ok) {
    box.append(longText(pretty(v), { class: "json" }));
  } else {
    box.append(h("div", { class: "muted small" }, "arguments (not valid JSON):"), longText(v, { class: "json" }));
  }
  return box;
}

function renderToolOutput(m, info) {
  const i = info || {};
  const badges = [];
  if (i.exit_code !== null && i.exit_code !== undefined) {
    const cls = i.timed_out ? "warn-badge" : Number(i.exit_code) === 0 ? "good" : "bad";
    badges.push(h("span", { class: `badge ${cls}`, "data-testid": "exit-code", title: "exit code" }, String(i.exit_code)));
  }
  if (i.timed_out) badges.push(h("span", { class: "badge warn-badge" }, "timed out"));
  if (i.error) badges.push(h("span", { class: "badge bad" }, "tool error"));
  if (i.truncated) badges.push(h("span", { class: "trunc-note" }, "output truncated"));
  if (typeof i.seconds === "number") badges.push(h("span", { class: "muted small" }, fmtSecs(i.seconds)));
  const text = messageText(m);
  return h(
    "div",
    { class: "tool-out" },
    h("div", { class: "tool-head" }, h("span", { class: "muted" }, "output"), m.name ? h("span", { class: "muted small" }, ` ${m.name}`) : null, ...badges),
    longText(text === "" ? "" : text, { class: `out${text === "" ? " empty" : ""}`, "data-testid": "tool-output" }),
  );
}

// ---- patch ------------------------------------------------------------------------------------

function diffClass(line) {
  if (/^(diff --git|index |--- |\+\+\+ |new file|deleted file|similarity|rename |old mode|new mode|Binary files)/.test(line)) return "d-file";
  if (line.startsWith("@@")) return "d-hunk";
  if (line.startsWith("+")) return "d-add";
  if (line.startsWith("-")) return "d-del";
  return "d-ctx";
}

function renderPatch(patch) {
  const lines = String(patch).split("\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  let adds = 0;
  let dels = 0;
  let files = 0;
  const pre = h("pre", { class: "diff" });
  const frag = document.createDocumentFragment();
  for (const line of lines) {
    const cls = diffClass(line);
    if (cls === "d-add") adds++;
    else if (cls === "d-del") dels++;
    else if (line.startsWith("diff --git")) files++;
    frag.append(h("span", { class: `dl ${cls}` }, `${line}\n`));
  }
  pre.append(frag);
  return card(
    "Patch",
    h("div", { "data-testid": "patch" }, h("div", { class: "small diff-stat" }, `${files || "?"} file${files === 1 ? "" : "s"} · `, h("span", { class: "good-text" }, `+${adds}`), " ", h("span", { class: "bad-text" }, `−${dels}`)), pre),
  );
}
