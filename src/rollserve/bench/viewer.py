"""``rollserve bench viewer``: how fast the web viewer's pages answer over a store of many jobs.

The bench fills a fresh SQLite store with ``jobs`` finished jobs of several kinds (results with
messages, rewards, exit reasons, policy versions, GRPO groups), starts a real ``rollserve
serve`` on it, and asks for the pages the viewer asks for — the jobs table, filtered, sorted
and paged deep, a group, a trajectory — reading the server's own time from ``Server-Timing``.
The fill writes the rows in bulk, as the store's columns are; the store's own lifecycle calls
(claim, finish) would take minutes for 100,000 jobs and are measured by ``bench store``."""

from __future__ import annotations

import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
from rich.table import Table

from rollserve.bench.serve import start_node, stop_node
from rollserve.bench.stats import quantile
from rollserve.client import wait_ready
from rollserve.ports import free_port
from rollserve.schema.bench import ViewerBenchResult, ViewerPage
from rollserve.storage.sqlite import SqliteJobStore

GOAL_MS = 300.0
_KINDS = ("math", "code", "swe", "lookup")
_REASONS = ("submitted", "submitted", "submitted", "max_turns", "max_tokens", "timeout")
_CHUNK = 5_000


def _result(rng: random.Random, index: int, kind: str) -> dict[str, object]:
    """A finished rollout's result as the pipeline stores it: a few turns of messages."""
    turns = rng.randint(1, 6)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Solve the task with the tools."},
        {"role": "user", "content": f"{kind} task {index}: " + "details " * 40},
    ]
    for turn in range(turns):
        arguments = json.dumps({"command": f"ls {turn}"})
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": "Let me look.", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": "out\n" * 30})
    version = index * 50 // 100_000
    return {
        "reward": float(rng.random() < 0.4),
        "exit_reason": rng.choice(_REASONS),
        "evaluation": {"correct": False},
        "messages": messages,
        "turns": turns,
        "min_policy_version": version,
        "max_policy_version": version,
    }


def fill(path: Path, jobs: int, *, seed: int = 0) -> None:
    """``jobs`` jobs over ten hours: groups of 8, 93 % completed, 5 % failed, 2 % waiting
    for a retry a day away (queued, but nothing the server under test would work on)."""
    SqliteJobStore(path).close()  # the schema, as the server makes it
    rng = random.Random(seed)
    start = time.time() - 10 * 3600
    rows = []
    for index in range(jobs):
        kind = _KINDS[(index // 8) % len(_KINDS)]
        created = start + index * 36_000 / jobs
        request = {"task": {"task_id": f"{kind}-{index // 8}", "kind": kind}, "model": "policy"}
        roll = rng.random()
        status = "failed" if roll < 0.05 else "queued" if roll < 0.07 else "completed"
        result = _result(rng, index, kind) if status == "completed" else None
        error = None
        if status == "failed":
            error = {"code": "sandbox_died", "message": "the sandbox died", "details": {}}
        done = status != "queued"
        timing = {"queued_s": 0.1, "init_s": 0.2, "run_s": 4.0, "eval_s": 0.5} if done else {}
        rows.append(
            (
                f"job-{index:06d}",
                f"group-{index // 8:05d}",
                json.dumps(request),
                "done" if done else "init",
                status,
                1,
                json.dumps(result) if result else None,
                json.dumps(error) if error else None,
                json.dumps(timing),
                created,
                created + 5 if done else created,
                created + 5 if done else None,
                index + 1 if done else None,
                None if done else time.time() + 86_400,
            )
        )
    with sqlite3.connect(path) as db:
        for at in range(0, len(rows), _CHUNK):
            db.executemany(
                "INSERT INTO jobs (job_id, group_id, request, priority, stage, status, attempts,"
                " result, error, timing, created, updated, finished, done_seq, not_before)"
                " VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows[at : at + _CHUNK],
            )
        db.execute("UPDATE counters SET value = ? WHERE name = 'done_seq'", (jobs,))


def _pages(jobs: int) -> list[tuple[str, str]]:
    """The viewer's requests: name and path."""
    deep = max(0, jobs // 2)
    return [
        ("jobs table, newest first", "/v1/jobs"),
        ("jobs table, page at the middle", f"/v1/jobs?offset={deep}"),
        ("failed jobs", "/v1/jobs?status=failed"),
        ("kind + reward ≥ 1, by reward", "/v1/jobs?kind=swe&reward_min=1&sort=reward"),
        ("exit reason timeout, oldest first", "/v1/jobs?exit_reason=timeout&order=asc"),
        ("policy version ≥ 40, by version", "/v1/jobs?policy_version_min=40&sort=policy_version"),
        ("one hour of jobs", "/v1/jobs?" + urlencode(_hour())),
        ("a GRPO group", "/v1/jobs?group_id=group-00042&limit=500&sort=created&order=asc"),
        ("a trajectory", "/v1/jobs/job-000336/trajectory"),
        ("fleet status", "/v1/status"),
    ]


def _hour() -> dict[str, float]:
    now = time.time()
    return {"created_after": now - 5 * 3600, "created_before": now - 4 * 3600}


def bench_viewer(jobs: int = 100_000, *, repeats: int = 20) -> ViewerBenchResult:
    """Fill a store with ``jobs`` jobs and time each page ``repeats`` times."""
    with tempfile.TemporaryDirectory(prefix="rollserve-bench-viewer-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        began = time.perf_counter()
        fill(data / "jobs.db", jobs)
        fill_s = time.perf_counter() - began
        port = free_port()
        node = start_node(port, data, Path(tmp) / "server.log")
        try:
            url = f"http://127.0.0.1:{port}"
            if not wait_ready(url, 120):
                raise RuntimeError(f"the server did not start: see {tmp}/server.log")
            with httpx.Client(base_url=url, timeout=60) as http:
                pages = [_time(http, name, path, repeats) for name, path in _pages(jobs)]
        finally:
            stop_node(node)
    return ViewerBenchResult(
        jobs=jobs, store="sqlite", fill_s=round(fill_s, 1), pages=pages, goal_ms=GOAL_MS
    )


def _time(http: httpx.Client, name: str, path: str, repeats: int) -> ViewerPage:
    server, trips, total = [], [], None
    http.get(path).raise_for_status()  # once unmeasured: the first read warms the page cache
    for _ in range(repeats):
        began = time.perf_counter()
        answer = http.get(path)
        trips.append(time.perf_counter() - began)
        answer.raise_for_status()
        timing = answer.headers["server-timing"]
        server.append(float(timing.partition("dur=")[2]) / 1000)
        listing = path == "/v1/jobs" or path.startswith("/v1/jobs?")
        total = answer.json()["total"] if listing else None
    return ViewerPage(
        name=name,
        path=path,
        total=total,
        server_ms_p50=round(quantile(server, 0.5) * 1000, 2),
        server_ms_max=round(max(server) * 1000, 2),
        roundtrip_ms_p50=round(quantile(trips, 0.5) * 1000, 2),
        n=repeats,
    )


def viewer_table(result: ViewerBenchResult) -> Table:
    table = Table(title=f"web viewer over {result.jobs:,} stored jobs ({result.store})")
    for column in ("page", "matching", "server p50 ms", "server max ms", "round trip p50 ms"):
        table.add_column(column, justify="left" if column == "page" else "right")
    for page in result.pages:
        table.add_row(
            page.name,
            f"{page.total:,}" if page.total is not None else "",
            f"{page.server_ms_p50:.1f}",
            f"{page.server_ms_max:.1f}",
            f"{page.roundtrip_ms_p50:.1f}",
        )
    return table
