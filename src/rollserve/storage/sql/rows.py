"""The rules the SQL store applies to a job's row: turning it into a JobRecord, and who holds,
requeues and releases a job."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rollserve.errors import LeaseLostError
from rollserve.storage.base import STAGE_STATUS, JobRecord, JobStatus, Stage
from rollserve.storage.sql.dialect import Row

_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(JobRecord))
RECORD_COLUMNS = ", ".join(f.name for f in dataclasses.fields(JobRecord))
"""A RETURNING list of what a JobRecord holds (not the columns made for the viewer's
filters)."""


def to_record(row: Row) -> JobRecord:
    """A job's row, its JSON columns already decoded, as a JobRecord (the columns generated
    for the jobs table's filters are left out)."""
    data = {key: value for key, value in row.items() if key in _RECORD_FIELDS}
    data["timing"] = data["timing"] or {}
    data["stage"] = Stage(data["stage"])
    data["status"] = JobStatus(data["status"])
    data["cancel_requested"] = bool(data["cancel_requested"])
    return JobRecord(**data)


def held(row: Row, job_id: str, owner: str) -> Row:
    """The job's row, once it is known that ``owner`` holds the job."""
    if row["lease_owner"] != owner or row["stage"] == Stage.DONE.value:
        raise LeaseLostError(f"{owner} does not hold job {job_id!r}", job_id=job_id)
    return row


def waiting_for(stage: Stage) -> tuple[JobStatus, int]:
    """A job given back to wait for ``stage``: its status, and the attempts it adds (the stage
    starts over; an init claim counts itself, so going back to init adds none here)."""
    if stage == Stage.INIT:
        return JobStatus.QUEUED, 0
    return STAGE_STATUS[stage], 1


def released_to(stage: str) -> Stage:
    """Where a job of a node that is gone goes: its sandbox went with the node, so init and run
    start again from init; eval works from the stored run output in a fresh sandbox."""
    return Stage.EVAL if stage == Stage.EVAL.value else Stage.INIT


def gone(row: Row, now: float, live: set[str], alive: Callable[[str], bool]) -> bool:
    """Whether the job of ``row`` (held or pinned by a node) belongs to a node that is gone:
    ``alive`` says so (a dead process of this host), or the node's row and the job's lease
    have both expired (``live``: owners whose node row is current)."""
    holder = row["lease_owner"] or row["node"]
    leased = row["lease_owner"] is not None and row["lease_expires"] >= now
    return not (alive(holder) and (holder in live or leased))
