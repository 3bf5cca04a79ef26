// tokens.js — the token view: prompt tokens grey, generated tokens (mask 1) blue with an
// intensity from their probability, observation tokens (mask 0) amber; 2,000 tokens a page.

import { fmtInt, h, setText } from "./dom.js";

const PAGE = 2000;

// probability buckets for generated tokens: darker = less likely (the surprising ones stand out)
const BUCKETS = [
  { min: 0.9, cls: "lp0", label: "p ≥ 0.9" },
  { min: 0.6, cls: "lp1", label: "≥ 0.6" },
  { min: 0.3, cls: "lp2", label: "≥ 0.3" },
  { min: 0.1, cls: "lp3", label: "≥ 0.1" },
  { min: -1, cls: "lp4", label: "< 0.1" },
];

function bucket(logprob) {
  if (typeof logprob !== "number" || !Number.isFinite(logprob)) return "lpn";
  const p = Math.exp(Math.min(0, logprob));
  return BUCKETS.find((b) => p >= b.min).cls;
}

/** Visible text of a token: newlines and tabs get a marker so that they can be seen. */
function shown(text) {
  if (text === "") return "∅";
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "⇥\t");
}

/** The token view element for a trajectory's `tokens` and optional `token_text`. */
export function tokenView(tokens, tokenText) {
  const prompt = Array.isArray(tokens.prompt_ids) ? tokens.prompt_ids : [];
  const resp = Array.isArray(tokens.response_ids) ? tokens.response_ids : [];
  const mask = Array.isArray(tokens.response_mask) ? tokens.response_mask : [];
  const lps = Array.isArray(tokens.response_logprobs) ? tokens.response_logprobs : [];
  const texts = Array.isArray(tokenText) && tokenText.length === prompt.length + resp.length ? tokenText : null;
  const total = prompt.length + resp.length;
  const generated = resp.reduce((n, _, i) => n + (Number(mask[i] ?? 1) === 1 ? 1 : 0), 0);
  const observation = resp.length - generated;
  const pages = Math.max(1, Math.ceil(total / PAGE));
  let page = 0;

  const summary = h(
    "div",
    { class: "tok-summary" },
    `${fmtInt(prompt.length)} prompt tokens · ${fmtInt(resp.length)} response tokens (${fmtInt(generated)} generated, ${fmtInt(observation)} observation)`,
    tokens.logprob_mode ? h("span", { class: "muted" }, ` · logprobs: ${tokens.logprob_mode}`) : null,
  );
  const legend = h(
    "div",
    { class: "legend tok-legend" },
    h("span", { class: "legend-item" }, h("span", { class: "tok-key key-prompt" }, "prompt")),
    h("span", { class: "legend-item" }, "generated, darker = less likely: ", BUCKETS.map((b) => h("span", { class: `tok-key key-gen ${b.cls}` }, b.label))),
    h("span", { class: "legend-item" }, h("span", { class: "tok-key key-obs" }, "observation (mask 0)")),
  );
  const info = h("span", { class: "muted small" });
  const prev = h("button", { type: "button", class: "btn small", "data-testid": "token-prev" }, "‹ prev");
  const next = h("button", { type: "button", class: "btn small", "data-testid": "token-next" }, "next ›");
  const body = h("div", { class: `tok-body${texts ? "" : " ids"}` });

  function renderPage() {
    const start = page * PAGE;
    const end = Math.min(total, start + PAGE);
    const frag = document.createDocumentFragment();
    for (let pos = start; pos < end; pos++) frag.append(tokenSpan(pos));
    body.replaceChildren(frag);
    setText(info, `tokens ${fmtInt(total ? start + 1 : 0)}–${fmtInt(end)} of ${fmtInt(total)} · page ${page + 1} / ${pages}`);
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }

  function tokenSpan(pos) {
    const isPrompt = pos < prompt.length;
    const ri = pos - prompt.length;
    const id = isPrompt ? prompt[pos] : resp[ri];
    const text = texts ? shown(String(texts[pos] ?? "")) : String(id);
    if (isPrompt) {
      return h("span", { class: "tok tok-prompt", "data-mask": "p", "data-id": id, title: `id ${id} · pos ${pos} · prompt` }, text);
    }
    const m = Number(mask[ri] ?? 1) === 1 ? "1" : "0";
    const lp = lps[ri];
    const lpText = typeof lp === "number" ? `${lp.toFixed(4)} (p ${Math.exp(Math.min(0, lp)).toFixed(3)})` : "n/a";
    const cls = m === "1" ? `tok tok-gen ${bucket(lp)}` : "tok tok-obs";
    return h("span", { class: cls, "data-mask": m, "data-id": id, title: `id ${id} · pos ${pos} · mask ${m} · logprob ${lpText}` }, text);
  }

  prev.addEventListener("click", () => {
    if (page > 0) {
      page -= 1;
      renderPage();
    }
  });
  next.addEventListener("click", () => {
    if (page < pages - 1) {
      page += 1;
      renderPage();
    }
  });
  renderPage();
  return h("div", { class: "tokens" }, summary, legend, h("div", { class: "tok-pager" }, prev, next, info), body);
}
