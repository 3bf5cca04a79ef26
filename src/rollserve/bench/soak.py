"""``rollserve bench soak``: thousands of short rollouts of mixed outcomes through one
``rollserve serve`` process, whose file descriptors, threads, memory, descendants and sandbox
state directory are sampled as the rollouts end. A leak shows as growth from the first
sample past the warm-up to the last.

The rollouts (the ``echo`` task and ``script`` agent of ``rollserve.testing.plugin``, real
bwrap sandboxes) come in six kinds, in turn: rewarded, unrewarded, cut at max_turns, an
init failure that is retried, an evaluation that fails every attempt (``failed``), and a
long command cancelled while it runs (or before it starts).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.table import Table

from rollserve.bench.serve import start_node, stop_node
from rollserve.client import RolloutClient, wait_ready
from rollserve.ports import free_port
from rollserve.schema.bench import SoakBenchResult, SoakSample

KINDS = ("rewarded", "unrewarded", "max_turns", "retried", "failed", "cancelled")
_WARMUP = 0.2  # the first fifth warms caches and pools; drift is measured from its end


def _job(index: int, tag: str) -> tuple[str, dict[str, Any]]:
    kind = KINDS[index % len(KINDS)]
    job_id = f"{tag}-{index}"
    task: dict[str, Any] = {"task_id": job_id, "kind": "echo", "prompt": job_id}
    commands = [f"printf %s {job_id} > answer.txt"]
    agent: dict[str, Any] = {"name": "script", "commands": commands, "max_turns": 3}
    if kind == "unrewarded":
        agent["commands"] = ["printf %s wrong > answer.txt"]
    elif kind == "max_turns":
        agent["commands"] = ["true"] * 4 + commands
    elif kind == "retried":
        task["fail_init"] = 1
    elif kind == "failed":
        task["fail_eval"] = 9
    elif kind == "cancelled":
        agent["commands"] = ["sleep 60", *commands]
    return kind, {"job_id": job_id, "task": task, "agent": agent}


def _sample(pid: int, data_dir: Path, done: int, started: float) -> SoakSample:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return SoakSample(
        done=done,
        seconds=round(time.monotonic() - started, 3),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(fields["Threads"]),
        rss_mib=round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        processes=len(_descendants(pid)),
        sandbox_dirs=len(os.listdir(data_dir / "sandboxes"))
        if (data_dir / "sandboxes").exists()
        else 0,
    )


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _drift(first: SoakSample, last: SoakSample) -> dict[str, float]:
    """Growth from the idle sample after the warm-up to the idle sample at the end, in
    percent: with nothing in flight, what is left is what leaked."""

    def pct(field: str) -> float:
        a, b = getattr(first, field), getattr(last, field)
        return round((b - a) / a * 100, 1) if a else (0.0 if b == a else 100.0)

    return {field: pct(field) for field in ("fds", "threads", "rss_mib", "processes")}


def _idle(pid: int, data_dir: Path, done: int, started: float) -> SoakSample:
    """A sample once the sandboxes of ended rollouts have closed (they close just after their
    results are stored)."""
    deadline = time.monotonic() + 10
    while True:
        sample = _sample(pid, data_dir, done, started)
        if sample.sandbox_dirs == 0 or time.monotonic() > deadline:
            return sample
        time.sleep(0.1)


def bench_soak(rollouts: int = 5000, in_flight: int = 48, samples: int = 20) -> SoakBenchResult:
    """Run ``rollouts`` through a fresh server, ``in_flight`` at a time."""
    base = Path(tempfile.mkdtemp(prefix="rollserve-soak-"))
    data_dir = base / "data"
    port = free_port()
    config = base / "soak.toml"  # a server that retries soon and gives up after one retry
    config.write_text("max_attempts = 2\nretry_backoff_s = 0.05\n")
    pools = [f"--run-workers={in_flight}", "--init-workers=8", "--eval-workers=8"]
    server = start_node(port, data_dir, base / "server.log", f"--config={config}", *pools)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(url, 60):
            raise RuntimeError(f"the server did not become ready (log: {base / 'server.log'})")
        result = _soak(url, server.pid, data_dir, rollouts, in_flight, samples)
    finally:
        stop_node(server)
    shutil.rmtree(base, ignore_errors=True)  # kept, with the server's log, when it failed
    return result


def _soak(
    url: str, pid: int, data_dir: Path, rollouts: int, in_flight: int, samples: int
) -> SoakBenchResult:
    tag = f"soak{os.getpid()}"
    every = max(1, rollouts // samples)
    kinds: dict[str, str] = {}
    cancel: list[str] = []
    seen: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    attempts: dict[str, int] = {}  # by kind, the most any rollout of it took
    taken: list[SoakSample] = []
    warm: SoakSample | None = None
    warmup = max(1, int(rollouts * _WARMUP))
    started = time.monotonic()
    with RolloutClient(url, timeout=60) as client:
        cursor, submitted = client.status().results_cursor, 0
        while sum(seen.values()) < rollouts:
            outstanding = submitted - sum(seen.values())
            if warm is None and submitted >= warmup and outstanding == 0:
                warm = _idle(pid, data_dir, submitted, started)  # then the rest
            holding = warm is None and submitted >= warmup  # the warm-up drains first
            if submitted < rollouts and outstanding < in_flight and not holding:
                batch = [_job(i, tag) for i in range(submitted, min(rollouts, submitted + 16))]
                client.submit_batch([job for _, job in batch])
                for kind, job in batch:
                    kinds[job["job_id"]] = kind
                    if kind == "cancelled":
                        cancel.append(job["job_id"])
                submitted += len(batch)
            for job_id in cancel:
                client.cancel(job_id)
            cancel.clear()
            page = client.results(cursor, limit=1000, wait=0.2)
            cursor = page.next
            for view in page.results:
                if view.job_id not in kinds:
                    continue
                before = sum(seen.values())
                seen[view.job_id] += 1
                statuses[view.status] += 1
                kind = kinds[view.job_id]
                attempts[kind] = max(attempts.get(kind, 0), view.attempts)
                if (before + 1) % every == 0:
                    taken.append(_sample(pid, data_dir, before + 1, started))
        elapsed = time.monotonic() - started
    end = _idle(pid, data_dir, rollouts, started)
    outcomes = Counter(kinds[j] for j in seen)
    return SoakBenchResult(
        rollouts=rollouts,
        seconds=round(elapsed, 3),
        rollouts_per_s=round(rollouts / elapsed, 2),
        outcomes=dict(outcomes),
        statuses=dict(statuses),
        attempts=attempts,
        lost=sum(1 for j in kinds if j not in seen),
        duplicates=sum(1 for n in seen.values() if n > 1),
        samples=taken,
        warm=warm or end,
        end=end,
        drift_pct=_drift(warm or end, end),
        sandbox_dirs_left=end.sandbox_dirs,
        processes_left=end.processes,
    )


def soak_table(result: SoakBenchResult) -> Table:
    table = Table(
        title=f"soak: {result.rollouts} rollouts in {result.seconds:.0f} s "
        f"({result.rollouts_per_s:.1f}/s)"
    )
    for column in ("ended", "s", "fds", "threads", "RSS MiB", "processes", "sandbox dirs"):
        table.add_column(column, justify="right")
    for s in result.samples:
        table.add_row(
            str(s.done), f"{s.seconds:.0f}", str(s.fds), str(s.threads), f"{s.rss_mib:.0f}",
            str(s.processes), str(s.sandbox_dirs),
        )  # fmt: skip
    drift = ", ".join(f"{k} {v:+.1f}%" for k, v in result.drift_pct.items())
    table.caption = (
        f"idle after the warm-up against idle at the end: {drift}; lost {result.lost},"
        f" duplicates {result.duplicates};"
        f" left at the end: {result.sandbox_dirs_left} sandbox dirs,"
        f" {result.processes_left} processes"
    )
    return table
