"""``rollserve submit`` and ``rollserve status``: a server's API from the command line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.table import Table

from rollserve.client import RolloutClient
from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import TERMINAL, JobRequest, JobStatus


def read_jobs(path: Path) -> list[JobRequest]:
    """One JobRequest per line; a bad line is named with its number."""
    jobs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            jobs.append(JobRequest.model_validate_json(line))
        except ValidationError as exc:
            raise InvalidInputError(
                f"{path}:{number}: {exc.errors()[0]['msg']} at "
                f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}"
            ) from exc
    if not jobs:
        raise InvalidInputError(f"{path} holds no jobs")
    return jobs


_STATUSES = tuple(status.value for status in JobStatus)


def _progress(server: Counter[str], mine: Counter[str], total: int) -> Table:
    """Jobs by stage on the server, and how many of this submission have finished."""
    done = sum(mine.values())
    title = f"{done}/{total} of these jobs done; the server's jobs by status:"
    table = Table(*_STATUSES, title=title)
    table.add_row(*(str(server.get(s, 0)) for s in _STATUSES))
    table.add_row(*(str(mine.get(s, "")) for s in _STATUSES), style="bold")
    return table


def submit(
    client: RolloutClient, path: Path, *, wait: bool, out: Path | None, console: Console
) -> int:
    """Submit the jobs of ``path``; with ``wait``, show progress and collect the results.
    Returns how many jobs did not complete."""
    jobs = read_jobs(path)
    cursor = client.status().results_cursor  # results from here on are new
    accepted = client.submit_batch(list(jobs))
    ids = [a.job_id for a in accepted]
    console.print(f"submitted {len(ids)} jobs ({sum(a.created for a in accepted)} new)")
    if not wait:
        for job_id in ids:
            console.print(job_id)
        return 0
    finished: dict[str, dict[str, Any]] = {}
    for known in accepted:  # resubmitted jobs that had already finished before the cursor
        if known.status in TERMINAL:
            finished[known.job_id] = client.get(known.job_id).model_dump(mode="json")
    pending = set(ids) - set(finished)
    with Live(console=console, refresh_per_second=4) as live:
        while True:
            mine = Counter(f["status"] for f in finished.values())
            live.update(_progress(Counter(client.status().jobs), mine, len(ids)))
            if not pending:
                break
            page = client.results(cursor, limit=1000, wait=1.0)
            cursor = page.next
            for job in page.results:
                if job.job_id in pending:
                    pending.discard(job.job_id)
                    finished[job.job_id] = job.model_dump(mode="json")
    if not console.is_terminal:
        console.line()
    if out is not None:
        out.write_text("".join(json.dumps(finished[j]) + "\n" for j in ids))
        console.print(f"results written to {out}")
    return sum(1 for f in finished.values() if f["status"] != "completed")
