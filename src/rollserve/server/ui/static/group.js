// group.js — a GRPO group: one bar per sample (height = reward, colour = status), reward
// statistics, counts by status; polled while any sample is still in flight.

import { getJSON } from "./api.js";
import { card, fmtNum, fmtReward, fmtSecs, h, STATUSES, statusBadge, TERMINAL, totalTiming } from "./dom.js";
import { rewardClass } from "./jobs.js";

const POLL_MS = 2000;

export function mountGroup(root, { ctx, param }) {
  const groupId = param;
  const page = h("div", { class: "page group", "data-testid": "group", "data-group-id": groupId });
  const body = h("div", null, h("p", { class: "muted" }, "loading…"));
  page.append(
    h("div", { class: "page-head" }, h("h1", null, "Group ", h("span", { class: "mono" }, groupId)), h("span", { class: "spacer" }), h("a", { href: `#/jobs?group_id=${encodeURIComponent(groupId)}` }, "open in jobs table")),
    body,
  );
  root.append(page);
  let lastKey = null;

  ctx.poll(async () => {
    const q = new URLSearchParams({ group_id: groupId, limit: "500", sort: "created", order: "asc" });
    let data;
    try {
      data = await getJSON(`/v1/jobs?${q}`);
    } catch (err) {
      if (!ctx.alive) return false;
      body.replaceChildren(h("div", { class: "error-block" }, `could not load the group: ${err.message}`));
      page.setAttribute("data-ready", "1");
      return true;
    }
    if (!ctx.alive) return false;
    const key = JSON.stringify(data);
    if (key !== lastKey) {
      lastKey = key;
      body.replaceChildren(renderGroup(data));
    }
    page.setAttribute("data-ready", "1");
    const jobs = data.jobs || [];
    return jobs.some((j) => !TERMINAL.has(j.status)); // keep polling while samples run
  }, POLL_MS);
}

// ---- statistics -------------------------------------------------------------------------------

function stats(values) {
  if (values.length === 0) return null;
  const n = values.length;
  const mean = values.reduce((a, b) => a + b, 0) / n;
  const variance = values.reduce((a, b) => a + (b - mean) ** 2, 0) / n;
  return { n, mean, min: Math.min(...values), max: Math.max(...values), std: Math.sqrt(variance) };
}

// ---- rendering --------------------------------------------------------------------------------

function renderGroup(data) {
  const jobs = data.jobs || [];
  const frag = document.createDocumentFragment();
  if (jobs.length === 0) {
    frag.append(h("div", { class: "card pad muted" }, "no jobs in this group"));
    return frag;
  }
  const rewards = jobs.map((j) => j.reward).filter((r) => typeof r === "number" && Number.isFinite(r));
  const sv = stats(rewards);

  // summary line: stats + counts by status
  const counts = {};
  for (const j of jobs) counts[j.status] = (counts[j.status] || 0) + 1;
  const statusNames = [...STATUSES.filter((x) => x in counts), ...Object.keys(counts).filter((x) => !STATUSES.includes(x))];
  const summary = h(
    "div",
    { class: "group-summary" },
    h("span", { class: "kv" }, h("span", { class: "k" }, "samples"), h("span", { class: "v" }, String(jobs.length))),
    ...["mean", "min", "max", "std"].map((k) => h("span", { class: "kv" }, h("span", { class: "k" }, k), h("span", { class: "v mono" }, sv ? fmtNum(sv[k]) : "—"))),
    h("span", { class: "status-inline" }, statusNames.map((st) => h("span", { class: "sc" }, statusBadge(st), ` ${counts[st]}`))),
  );
  frag.append(summary);
  if (Number(data.total) > jobs.length) {
    frag.append(h("div", { class: "notice small" }, `showing the first ${jobs.length} of ${data.total} samples`));
  }
  if (sv && sv.n >= 2 && sv.max === sv.min) {
    frag.append(h("div", { class: "notice warn-note", "data-testid": "group-flat" }, `all rewards equal (${fmtReward(sv.min)}): no learning signal`));
  }
  frag.append(card("Rewards by sample", barChart(jobs, sv)));
  frag.append(card("Samples", sampleTable(jobs)));
  return frag;
}

function barChart(jobs, sv) {
  // y range always includes 0 and 1 so a reward of 1 is a full bar in the usual [0, 1] case
  const lo = Math.min(0, sv ? sv.min : 0);
  const hi = Math.max(1, sv ? sv.max : 1);
  const span = hi - lo || 1;
  const zeroPct = ((0 - lo) / span) * 100; // position of the zero line from the bottom
  const many = jobs.length > 24;
  const bars = jobs.map((j) => {
    const id = String(j.job_id);
    const r = typeof j.reward === "number" ? j.reward : null;
    const tail = id.length > 6 ? id.slice(-6) : id;
    let barStyle;
    if (r === null) barStyle = { bottom: `${zeroPct}%`, height: "3px" };
    else if (r >= 0) barStyle = { bottom: `${zeroPct}%`, height: `max(2px, ${((r / span) * 100).toFixed(2)}%)` };
    else barStyle = { bottom: `${(((r - lo) / span) * 100).toFixed(2)}%`, height: `${((-r / span) * 100).toFixed(2)}%` };
    return h(
      "a",
      {
        class: `gbar${r === null ? " pending" : ""}`,
        href: `#/jobs/${encodeURIComponent(id)}`,
        "data-testid": "group-sample",
        "data-job-id": id,
        "data-reward": r ?? "",
        "data-status": j.status ?? "",
        title: `${id}\nstatus ${j.status}\nreward ${fmtReward(r)}${j.exit_reason ? `\nexit ${j.exit_reason}` : ""}`,
      },
      h("span", { class: "gplot" }, h("span", { class: `gfill st-bg-${j.status}`, style: barStyle }), h("span", { class: "gval", style: { bottom: `calc(${r !== null && r > 0 ? zeroPct + (r / span) * 100 : zeroPct}% + 2px)` } }, fmtReward(r))),
      h("span", { class: `glabel mono${many ? " rot" : ""}` }, tail),
    );
  });
  return h(
    "div",
    { class: "gchart" },
    h("div", { class: "gaxis" }, h("span", { style: { bottom: "100%" } }, fmtNum(hi, 2)), h("span", { style: { bottom: `${zeroPct}%` } }, "0"), lo < 0 ? h("span", { style: { bottom: "0%" } }, fmtNum(lo, 2)) : null),
    h("div", { class: "gbars" }, h("span", { class: "gzero", style: { bottom: `${zeroPct}%` } }), bars),
  );
}

function sampleTable(jobs) {
  return h(
    "table",
    { class: "grid" },
    h("thead", null, h("tr", null, ["job", "status", "reward", "exit reason", "policy", "turns", "duration"].map((t, i) => h("th", { class: i >= 2 && i !== 3 ? "num" : null }, t)))),
    h(
      "tbody",
      null,
      jobs.map((j) =>
        h(
          "tr",
          null,
          h("td", { class: "mono" }, h("a", { href: `#/jobs/${encodeURIComponent(j.job_id)}` }, j.job_id)),
          h("td", null, statusBadge(j.status), j.error_code ? h("span", { class: "errcode" }, j.error_code) : null),
          h("td", { class: `num reward ${rewardClass(j.reward)}` }, fmtReward(j.reward)),
          h("td", null, j.exit_reason ?? "—"),
          h("td", { class: "num" }, j.policy_version === null || j.policy_version === undefined ? "—" : `v${j.policy_version}`),
          h("td", { class: "num" }, j.turns ?? "—"),
          h("td", { class: "num" }, fmtSecs(totalTiming(j.timing))),
        ),
      ),
    ),
  );
}
