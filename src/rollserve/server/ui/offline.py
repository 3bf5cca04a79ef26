"""``rollserve view RESULTS.jsonl``: the viewer over a results file (the JobViews written by
``rollserve submit --out`` or the demo), with no service running. It answers the API routes the
viewer reads — the jobs list, a job, its trajectory, a status naming the file — from memory,
and ``/readyz`` once it serves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query

from rollserve.client.parquet import read_results
from rollserve.errors import JobNotFoundError
from rollserve.pipeline.trajectories import build_trajectory
from rollserve.schema.api import JobQuery, JobsPage, JobSummary, Trajectory
from rollserve.schema.jobs import JobView
from rollserve.server import errors
from rollserve.server.ui.routes import mount_ui


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


def _matches(query: JobQuery, row: JobSummary) -> bool:
    def within(value: float | None, low: float | None, high: float | None) -> bool:
        if low is None and high is None:
            return True
        return (
            value is not None and (low is None or value >= low) and (high is None or value <= high)
        )

    statuses = {s.value for s in query.status}
    reasons = {r.value for r in query.exit_reason}
    created_ok = (query.created_after is None or row.created >= query.created_after) and (
        query.created_before is None or row.created < query.created_before
    )
    return (
        (not statuses or row.status in statuses)
        and (not reasons or row.exit_reason in reasons)
        and (query.group_id is None or row.group_id == query.group_id)
        and (query.kind is None or row.kind == query.kind)
        and within(row.reward, query.reward_min, query.reward_max)
        and within(row.policy_version, query.policy_version_min, query.policy_version_max)
        and created_ok
    )


def page(rows: list[JobSummary], query: JobQuery) -> JobsPage:
    """The stores' order: by the sort column, jobs without a value last, then file order."""
    found = [(i, r) for i, r in enumerate(rows) if _matches(query, r)]
    descending = query.order == "desc"

    def key(item: tuple[int, JobSummary]) -> tuple[bool, float, int]:
        index, row = item
        value = getattr(row, query.sort)
        number = float(value) if value is not None else 0.0
        return (value is None, -number if descending else number, -index if descending else index)

    found.sort(key=key)
    chosen = found[query.offset : query.offset + query.limit]
    return JobsPage(
        jobs=[r for _, r in chosen], total=len(found), offset=query.offset, limit=query.limit
    )


def create_offline_app(
    path: Path, *, token_text: Callable[[list[int]], list[str]] | None = None
) -> FastAPI:
    """The viewer over ``path``; ``token_text`` turns token ids into their texts (a tokenizer
    given on the command line), else the token view shows ids."""
    views = {view.job_id: view for view in read_results(path)}
    rows = [summary(view) for view in views.values()]
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
        return page(rows, query)

    @api.get("/jobs/{job_id}/trajectory", response_model=Trajectory)
    async def trajectory(job_id: str) -> Trajectory:
        found = build_trajectory(job(job_id))
        if found.tokens is not None and token_text is not None:
            found.token_text = token_text(found.tokens.prompt_ids + found.tokens.response_ids)
        return found

    @api.get("/jobs/{job_id}", response_model=JobView)
    async def get_job(job_id: str) -> JobView:
        return job(job_id)

    app.include_router(api)
    mount_ui(app, None)
    errors.install(app)
    return app
