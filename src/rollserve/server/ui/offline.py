"""``rollserve view RESULTS.jsonl``: the viewer over a results file (the JobViews written by
``rollserve submit --out`` or the demo), with no service running. It answers the API routes the
viewer reads — the jobs list, a job, its trajectory, a status naming the file — from memory,
and ``/readyz`` once it serves."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query

from rollserve.client.parquet import read_results
from rollserve.errors import JobNotFoundError
from rollserve.pipeline.trajectories import add_token_text, build_trajectory
from rollserve.schema.api import JobQuery, JobsPage, JobSummary, Trajectory
from rollserve.schema.jobs import JobView
from rollserve.server import errors
from rollserve.server.ui.routes import mount_ui
from rollserve.storage.browse import order, where


def summary(view: JobView) -> JobSummary:
    """The jobs table's row of a job view."""
    result = view.result
    return JobSummary(
        job_id=view.job_id,
        group_id=view.group_id,
        task_id=view.task_id,
        kind=view.kind,
        model=view.model,
        status=view.status,
        attempts=view.attempts,
        reward=result.reward if result else None,
        exit_reason=result.exit_reason.value if result else None,
        policy_version=result.max_policy_version if result else None,
        turns=result.turns if result else None,
        error_code=view.error.code if view.error else None,
        created=view.created or 0.0,
        updated=view.finished or view.created or 0.0,
        finished=view.finished,
        timing=view.timing,
    )


class JobTable:
    """The file's jobs table in an in-memory SQLite table, browsed with the stores' own filters
    and order (:func:`rollserve.storage.browse.where` and ``order``); file order stands in for
    submit order."""

    # What the filters and sorts read (storage.browse names them the same).
    _COLUMNS = (
        "job_id",
        "group_id",
        "kind",
        "status",
        "reward",
        "exit_reason",
        "policy_version",
        "created",
        "updated",
        "finished",
    )

    def __init__(self, rows: list[JobSummary]) -> None:
        self.rows = rows
        # The viewer's routes run on one event loop, which need not be this thread.
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        columns = ", ".join(self._COLUMNS)
        self._db.execute(f"CREATE TABLE jobs (seq INTEGER PRIMARY KEY, {columns})")
        self._db.executemany(
            f"INSERT INTO jobs VALUES (?, {', '.join('?' * len(self._COLUMNS))})",
            [(seq, *(getattr(row, c) for c in self._COLUMNS)) for seq, row in enumerate(rows)],
        )

    def page(self, query: JobQuery) -> JobsPage:
        clause, params = where(query, "?")
        (total,) = self._db.execute(f"SELECT count(*) FROM jobs{clause}", params).fetchone()
        chosen = self._db.execute(
            f"SELECT seq FROM jobs{clause}{order(query)} LIMIT ? OFFSET ?",
            [*params, query.limit, query.offset],
        ).fetchall()
        return JobsPage(
            jobs=[self.rows[seq] for (seq,) in chosen],
            total=total,
            offset=query.offset,
            limit=query.limit,
        )


def create_offline_app(
    path: Path, *, token_text: Callable[[list[int]], list[str]] | None = None
) -> FastAPI:
    """The viewer over ``path``; ``token_text`` turns token ids into their texts (a tokenizer
    given on the command line), else the token view shows ids."""
    views = {view.job_id: view for view in read_results(path)}
    table = JobTable([summary(view) for view in views.values()])
    app = FastAPI(title=f"rollserve view {path.name}")
    api = APIRouter(prefix="/v1")

    def job(job_id: str) -> JobView:
        if job_id not in views:
            raise JobNotFoundError(f"no job {job_id!r} in {path}", job_id=job_id)
        return views[job_id]

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    @api.get("/status")
    async def status() -> dict[str, Any]:
        return {
            "offline": True,
            "source": str(path),
            "jobs": dict(Counter(view.status for view in views.values())),
        }

    @api.get("/jobs", response_model=JobsPage)
    async def list_jobs(query: Annotated[JobQuery, Query()]) -> JobsPage:
        return table.page(query)

    @api.get("/jobs/{job_id}/trajectory", response_model=Trajectory)
    async def trajectory(job_id: str) -> Trajectory:
        found = build_trajectory(job(job_id))
        if token_text is not None:
            add_token_text(found, token_text)
        return found

    @api.get("/jobs/{job_id}", response_model=JobView)
    async def get_job(job_id: str) -> JobView:
        return job(job_id)

    app.include_router(api)
    mount_ui(app, None)
    errors.install(app)
    return app
