"""Submitting jobs to the SQL job store: idempotent by job id, all or none, under the queue's
bound; the usual batch (new ids, room in the queue) in one statement."""

from __future__ import annotations

from collections.abc import Collection

from rollserve.errors import JobConflictError, QueueFullError
from rollserve.storage.base import JobStatus, NewJob, StoreEvent, Submitted
from rollserve.storage.sql.dialect import ColumnType, Dialect, Params

_NEW_JOB: tuple[tuple[str, ColumnType], ...] = (
    ("job_id", "text"),
    ("group_id", "text"),
    ("request", "json"),
    ("priority", "integer"),
)


def submit(db: Dialect, jobs: list[NewJob], max_queued: int) -> list[Submitted]:
    """:meth:`rollserve.storage.base.JobStore.submit` on the database of ``db``."""
    ids = [job.job_id for job in jobs]
    if not jobs or len(set(ids)) < len(ids):
        return _checked(db, jobs, max_queued)
    # Anything but new ids under the bound (ids seen before, a full queue, a race with another
    # node) is decided job by job.
    stored = {row["job_id"] for row in db.write(*_insert(db, jobs, max_queued))}
    if len(stored) == len(ids):
        return [Submitted(job_id, JobStatus.QUEUED, created=True) for job_id in ids]
    rest = _checked(db, [job for job in jobs if job.job_id not in stored], max_queued)
    decided = {s.job_id: s for s in rest}  # (those another node stored meanwhile stand)
    return [decided.get(i, Submitted(i, JobStatus.QUEUED, created=True)) for i in ids]


def _checked(db: Dialect, jobs: list[NewJob], max_queued: int) -> list[Submitted]:
    """Submit, job by job: ids seen before (the same request again, or a conflict),
    duplicates within the batch, the queue's bound."""
    out: list[Submitted] = []
    fresh: dict[str, NewJob] = {}
    if not jobs:
        return out
    with db.transaction() as tx:
        rows = tx.query(
            f"SELECT job_id, request, status FROM jobs WHERE {db.among('job_id', 'ids')}",
            {"ids": db.listed(list({job.job_id for job in jobs}))},
        )
        known = {row["job_id"]: row for row in rows}
        for job in jobs:
            earlier = known.get(job.job_id)
            if earlier is None and job.job_id in fresh:
                earlier = {"request": fresh[job.job_id].request, "status": "queued"}
            if earlier is not None:
                if earlier["request"] != job.request:
                    raise JobConflictError(
                        f"job {job.job_id!r} exists with another request", job_id=job.job_id
                    )
                out.append(Submitted(job.job_id, JobStatus(earlier["status"]), created=False))
                continue
            fresh[job.job_id] = job
            out.append(Submitted(job.job_id, JobStatus.QUEUED, created=True))
        if not fresh:
            return out
        waiting = int(tx.query("SELECT count(*) AS n FROM jobs WHERE stage <> 'done'")[0]["n"])
        if waiting + len(fresh) > max_queued:
            raise QueueFullError(
                f"the queue holds {waiting} unfinished jobs; {len(fresh)} more would pass "
                f"its bound of {max_queued}",
                queued=waiting,
                bound=max_queued,
            )
        stored = {row["job_id"] for row in tx.query(*_insert(db, fresh.values(), max_queued))}
    raced = [job_id for job_id in fresh if job_id not in stored]
    if raced:  # another node stored the same ids in between: its jobs stand
        again = {s.job_id: s for s in _checked(db, [fresh[i] for i in raced], max_queued)}
        out = [again.get(s.job_id, s) for s in out]
    return out


def _insert(db: Dialect, jobs: Collection[NewJob], max_queued: int) -> tuple[str, Params]:
    """The statement that stores ``jobs`` (distinct ids), all or none: none if an id is known
    already or the queue would pass its bound. It returns the ids stored."""
    listed = [
        {"job_id": j.job_id, "group_id": j.group_id, "request": j.request, "priority": j.priority}
        for j in jobs
    ]
    sql = (
        "INSERT INTO jobs (job_id, group_id, request, priority, stage, status, created, updated)"
        " SELECT n.job_id, n.group_id, n.request, n.priority, 'init', 'queued', :now, :now"
        f" FROM {db.records('jobs', _NEW_JOB)}"
        f" WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE {db.among('job_id', 'ids')})"
        " AND (SELECT count(*) FROM jobs WHERE stage <> 'done') + :k <= :max"
        # ON CONFLICT: another node may store one of the ids first.
        " ORDER BY n.ord ON CONFLICT (job_id) DO NOTHING"
        f" RETURNING job_id, {db.announce(StoreEvent.INIT)}"
    )
    params = {
        "jobs": db.json(listed),
        "ids": db.listed([job.job_id for job in jobs]),
        "k": len(listed),
        "max": max_queued,
    }
    return sql, params
