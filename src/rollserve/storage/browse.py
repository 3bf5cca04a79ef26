"""What the stores share about browsing jobs: the filters of ``GET /v1/jobs`` as SQL over the
jobs table's generated columns, the order, and a row as a JobSummary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollserve.schema.api import JobQuery, JobSummary
from rollserve.schema.jobs import JobTiming

# The columns a page of the jobs table reads: never the trajectory itself.
SUMMARY_COLUMNS = (
    "job_id, group_id, task_id, kind, model, status, attempts, reward, exit_reason,"
    " policy_version, turns, error_code, result IS NULL AS no_result, created, updated,"
    " finished, timing"
)
_SORTS = {
    "created": "created",
    "updated": "updated",
    "finished": "finished",
    "reward": "reward",
    "policy_version": "policy_version",
}


@dataclass(frozen=True)
class JobEvent:
    """One event of a running episode: the messages before the first turn (``turn`` 0), or
    one model turn's messages and log."""

    seq: int
    attempt: int
    turn: int
    at: float
    data: dict[str, Any]


def where(query: JobQuery, mark: str) -> tuple[str, list[Any]]:
    """The WHERE clause and its parameters, in order. ``mark`` is the driver's placeholder,
    formatted with the parameter's index: ``?``, or ``:p{}`` for named ones."""
    parts: list[str] = []
    params: list[Any] = []

    def add(sql: str, *values: Any) -> None:
        first, *rest = sql.split("?")
        marks = (mark.format(len(params) + i) + piece for i, piece in enumerate(rest))
        parts.append(first + "".join(marks))
        params.extend(values)

    if query.status:
        add(f"status IN ({', '.join('?' * len(query.status))})", *(s.value for s in query.status))
    if query.exit_reason:
        reasons = [r.value for r in query.exit_reason]
        add(f"exit_reason IN ({', '.join('?' * len(reasons))})", *reasons)
    for column, value in (("group_id", query.group_id), ("kind", query.kind)):
        if value is not None:
            add(f"{column} = ?", value)
    bounds = (
        ("reward", ">=", query.reward_min),
        ("reward", "<=", query.reward_max),
        ("policy_version", ">=", query.policy_version_min),
        ("policy_version", "<=", query.policy_version_max),
        ("created", ">=", query.created_after),
        ("created", "<", query.created_before),
    )
    for column, op, bound in bounds:
        if bound is not None:
            add(f"{column} {op} ?", bound)
    return (" WHERE " + " AND ".join(parts)) if parts else "", params


def order(query: JobQuery) -> str:
    """The ORDER BY clause: the sort column (jobs without a value last), then submit order."""
    direction = "DESC" if query.order == "desc" else "ASC"
    column = _SORTS[query.sort]
    return f" ORDER BY {column} {direction} NULLS LAST, seq {direction}"


def summary(row: Any, timing: dict[str, float]) -> JobSummary:
    """A row of SUMMARY_COLUMNS as the jobs table shows it; the error code only of a job that
    ended without a result (a retried job's last error is not its outcome)."""
    return JobSummary(
        job_id=row["job_id"],
        group_id=row["group_id"],
        task_id=row["task_id"],
        kind=row["kind"],
        model=row["model"],
        status=row["status"],
        attempts=row["attempts"],
        reward=row["reward"],
        exit_reason=row["exit_reason"],
        policy_version=row["policy_version"],
        turns=row["turns"],
        error_code=row["error_code"] if row["no_result"] and row["finished"] else None,
        created=row["created"],
        updated=row["updated"],
        finished=row["finished"],
        timing=JobTiming(**timing),
    )
