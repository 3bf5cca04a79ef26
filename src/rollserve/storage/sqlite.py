"""The job store on SQLite (WAL): one file, safe for several threads and processes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from rollserve.errors import (
    JobConflictError,
    JobNotFoundError,
    LeaseLostError,
    QueueFullError,
)
from rollserve.storage.base import (
    NODES_KEPT_S,
    STAGE_STATUS,
    JobRecord,
    JobStatus,
    NewJob,
    Stage,
    Submitted,
)
from rollserve.storage.rows import (
    JSON_COLUMNS,
    gone,
    held,
    merged_timing,
    released_to,
    to_record,
    waiting_for,
)
from rollserve.storage.sqlite_browse import SqliteBrowsing
from rollserve.storage.sqlite_connection import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "SqliteJobStore"]

_CHUNK = 500  # ids per statement, well under SQLite's limit on bound parameters


class SqliteJobStore(SqliteBrowsing):
    """:class:`rollserve.storage.base.JobStore` in one SQLite file."""

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, jobs: list[NewJob], *, max_queued: int) -> list[Submitted]:
        out: list[Submitted] = []
        fresh: dict[str, tuple[NewJob, str]] = {}
        with self._write() as db:
            now = self._clock()
            for job in jobs:
                request = json.dumps(job.request, sort_keys=True)
                row = db.execute(
                    "SELECT request, status FROM jobs WHERE job_id = ?", (job.job_id,)
                ).fetchone()
                known = (row["request"], JobStatus(row["status"])) if row else None
                if known is None and job.job_id in fresh:
                    known = (fresh[job.job_id][1], JobStatus.QUEUED)
                if known is not None:
                    if known[0] != request:
                        raise JobConflictError(
                            f"job {job.job_id!r} exists with another request", job_id=job.job_id
                        )
                    out.append(Submitted(job.job_id, known[1], created=False))
                    continue
                fresh[job.job_id] = (job, request)
                out.append(Submitted(job.job_id, JobStatus.QUEUED, created=True))
            waiting = db.execute("SELECT count(*) FROM jobs WHERE stage != 'done'").fetchone()[0]
            if waiting + len(fresh) > max_queued:
                raise QueueFullError(
                    f"the queue holds {waiting} unfinished jobs; {len(fresh)} more would pass "
                    f"its bound of {max_queued}",
                    queued=waiting,
                    bound=max_queued,
                )
            db.executemany(
                "INSERT INTO jobs (job_id, group_id, request, priority, stage, status, created,"
                " updated) VALUES (?, ?, ?, ?, 'init', 'queued', ?, ?)",
                [
                    (j.job_id, j.group_id, request, j.priority, now, now)
                    for j, request in fresh.values()
                ],
            )
        return out

    def get(self, job_id: str) -> JobRecord | None:
        rows = self._read("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        return _record(rows[0]) if rows else None

    def claim(self, stage: Stage, owner: str, lease_s: float) -> JobRecord | None:
        with self._write() as db:
            # The time once the file is ours (here and in every write): a wait for another
            # process's lock must not leave a lease or a node row written already stale.
            now = self._clock()
            row = db.execute(
                "SELECT * FROM jobs WHERE stage = ? AND cancel_requested = 0"
                " AND (lease_owner IS NULL OR lease_expires < ?) AND (node IS NULL OR node = ?)"
                " AND (not_before IS NULL OR not_before <= ?)"
                " ORDER BY priority DESC, seq LIMIT 1",
                (stage.value, now, owner, now),
            ).fetchone()
            if row is None:
                return None
            restart = stage == Stage.INIT or row["lease_owner"] is not None  # (taken over)
            attempts = row["attempts"] + (1 if restart else 0)
            db.execute(
                "UPDATE jobs SET lease_owner = ?, lease_expires = ?, status = ?, attempts = ?,"
                " updated = ? WHERE seq = ?",
                (owner, now + lease_s, STAGE_STATUS[stage].value, attempts, now, row["seq"]),
            )
        record = _record(row)
        record.lease_owner, record.lease_expires = owner, now + lease_s
        record.status, record.attempts = STAGE_STATUS[stage], attempts
        return record

    def heartbeat(
        self,
        job_ids: list[str],
        owner: str,
        lease_s: float,
        *,
        node: tuple[str, dict[str, Any]] | None = None,
    ) -> list[str]:
        stop: list[str] = []
        with self._write() as db:
            now = self._clock()
            if node is not None:
                db.execute(
                    "INSERT INTO nodes (owner, node_id, info, started, seen, expires)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET"
                    " info = excluded.info, seen = excluded.seen, expires = excluded.expires",
                    (owner, node[0], json.dumps(node[1]), now, now, now + lease_s),
                )
            for start in range(0, len(job_ids), _CHUNK):
                chunk = job_ids[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                db.execute(
                    f"UPDATE jobs SET lease_expires = ? WHERE job_id IN ({marks})"
                    " AND lease_owner = ? AND cancel_requested = 0",
                    (now + lease_s, *chunk, owner),
                )
                stop += [
                    row["job_id"]
                    for row in db.execute(
                        f"SELECT job_id FROM jobs WHERE job_id IN ({marks}) AND ("
                        " (stage != 'done' AND lease_owner IS NOT NULL AND lease_owner != ?)"
                        " OR (stage != 'done' AND cancel_requested = 1)"
                        " OR (stage = 'done' AND status = 'cancelled'))",
                        (*chunk, owner),
                    )
                ]
        return stop

    def _held(self, db: sqlite3.Connection, job_id: str, owner: str) -> sqlite3.Row:
        row: sqlite3.Row | None = db.execute(
            "SELECT * FROM jobs WHERE job_id = ?", (job_id,)
        ).fetchone()
        return held(row, job_id, owner)

    def advance(
        self,
        job_id: str,
        owner: str,
        stage: Stage,
        *,
        output: dict[str, Any] | None = None,
        timing: dict[str, float] | None = None,
        stay: bool = False,
    ) -> bool:
        with self._write() as db:
            now = self._clock()
            row = self._held(db, job_id, owner)
            if row["cancel_requested"]:  # cancelled during the stage: it ends here
                self._end_cancelled(db, row, now)
                return False
            # The run stage needs the sandbox that init made: it stays on the owner's node.
            node = owner if stage == Stage.RUN or stay else None
            db.execute(
                "UPDATE jobs SET stage = ?, status = ?, lease_owner = NULL, lease_expires = NULL,"
                " node = ?, stage_output = ?, timing = ?, updated = ? WHERE seq = ?",
                (
                    stage.value,
                    STAGE_STATUS[stage].value,
                    node,
                    _dump(output),
                    _merge_timing(row, timing),
                    now,
                    row["seq"],
                ),
            )
        return True

    def finish(
        self,
        job_id: str,
        owner: str | None,
        status: JobStatus,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        timing: dict[str, float] | None = None,
    ) -> None:
        if not status.terminal:
            raise ValueError(f"finish needs a terminal status, not {status}")
        with self._write() as db:
            now = self._clock()
            if owner is None:
                row = db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
                if row is None:
                    raise JobNotFoundError(f"no job {job_id!r}", job_id=job_id)
                if row["lease_owner"] is not None and row["lease_expires"] >= now:
                    raise LeaseLostError(f"job {job_id!r} is held by {row['lease_owner']}")
            else:
                row = self._held(db, job_id, owner)
            if row["stage"] == Stage.DONE.value:
                return
            done_seq = _next_done_seq(db)
            db.execute(
                "UPDATE jobs SET stage = 'done', status = ?, lease_owner = NULL,"
                " lease_expires = NULL, node = NULL, stage_output = NULL, result = ?, error = ?,"
                " timing = ?,"
                " updated = ?, finished = ?, done_seq = ? WHERE seq = ?",
                (
                    status.value,
                    _dump(result),
                    _dump(error),
                    _merge_timing(row, timing),
                    now,
                    now,
                    done_seq,
                    row["seq"],
                ),
            )
            if result is not None:  # the result holds the whole trajectory: no second copy
                db.execute("DELETE FROM job_events WHERE job_id = ?", (job_id,))

    def requeue(
        self,
        job_id: str,
        owner: str,
        stage: Stage,
        *,
        error: dict[str, Any] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        with self._write() as db:
            now = self._clock()
            row = self._held(db, job_id, owner)
            if row["cancel_requested"]:
                self._end_cancelled(db, row, now)
                return
            status, again = waiting_for(stage)
            db.execute(
                "UPDATE jobs SET stage = ?, status = ?, lease_owner = NULL, lease_expires = NULL,"
                " node = NULL, error = ?, updated = ?, not_before = ?, attempts = attempts + ?"
                " WHERE seq = ?",
                (stage.value, status.value, _dump(error), now, now + delay_s, again, row["seq"]),
            )

    def cancel(self, job_id: str) -> JobRecord:
        with self._write() as db:
            now = self._clock()
            row = db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFoundError(f"no job {job_id!r}", job_id=job_id)
            self._cancel_row(db, row, now)
        record = self.get(job_id)
        assert record is not None
        return record

    def _cancel_row(self, db: sqlite3.Connection, row: sqlite3.Row, now: float) -> None:
        if row["stage"] == Stage.DONE.value:
            return
        if row["lease_owner"] is not None and row["lease_expires"] >= now:
            db.execute(
                "UPDATE jobs SET cancel_requested = 1, updated = ? WHERE seq = ?",
                (now, row["seq"]),
            )
            return
        self._end_cancelled(db, row, now)

    def _end_cancelled(self, db: sqlite3.Connection, row: sqlite3.Row, now: float) -> None:
        done_seq = _next_done_seq(db)
        db.execute(
            "UPDATE jobs SET stage = 'done', status = 'cancelled', cancel_requested = 1,"
            " lease_owner = NULL, lease_expires = NULL, node = NULL, stage_output = NULL,"
            " updated = ?, finished = ?, done_seq = ? WHERE seq = ?",
            (now, now, done_seq, row["seq"]),
        )

    def cancel_group(self, group_id: str) -> list[str]:
        with self._write() as db:
            now = self._clock()
            rows = db.execute(
                "SELECT * FROM jobs WHERE group_id = ? AND stage != 'done'", (group_id,)
            ).fetchall()
            for row in rows:
                self._cancel_row(db, row, now)
        return [row["job_id"] for row in rows]

    def results(self, after: int, limit: int) -> list[JobRecord]:
        rows = self._read(
            "SELECT * FROM jobs WHERE done_seq > ? ORDER BY done_seq LIMIT ?", (after, limit)
        )
        return [_record(r) for r in rows]

    def recover(self, alive: Callable[[str], bool]) -> list[str]:
        released = []
        with self._write() as db:
            now = self._clock()
            live = {
                row[0] for row in db.execute("SELECT owner FROM nodes WHERE expires >= ?", (now,))
            }
            rows = db.execute(
                "SELECT * FROM jobs WHERE stage != 'done'"
                " AND (lease_owner IS NOT NULL OR node IS NOT NULL)"
            ).fetchall()
            for row in rows:
                if not gone(row, now, live, alive):
                    continue
                self._release(db, row, now)
                released.append(row["job_id"])
            db.execute("DELETE FROM nodes WHERE expires < ?", (now - NODES_KEPT_S,))
        return released

    def _release(self, db: sqlite3.Connection, row: sqlite3.Row, now: float) -> None:
        """Give a job of a node that is gone back to the queue (or end it if it was cancelled).
        Its sandbox lived on that node: init and run start again; eval works from the stored
        run output in a fresh sandbox."""
        if row["cancel_requested"]:
            self._end_cancelled(db, row, now)
            return
        stage = released_to(row["stage"])
        status, again = waiting_for(stage)
        db.execute(
            "UPDATE jobs SET stage = ?, status = ?, lease_owner = NULL, lease_expires = NULL,"
            " node = NULL, updated = ?, attempts = attempts + ? WHERE seq = ?",
            (stage.value, status.value, now, again, row["seq"]),
        )

    def leave(self, owner: str) -> list[str]:
        with self._write() as db:
            now = self._clock()
            rows = db.execute(
                "SELECT * FROM jobs WHERE stage != 'done' AND (lease_owner = ? OR node = ?)",
                (owner, owner),
            ).fetchall()
            for row in rows:
                self._release(db, row, now)
            db.execute("DELETE FROM nodes WHERE owner = ?", (owner,))
        return [row["job_id"] for row in rows]

    def purge(self, finished_before: float) -> int:
        with self._write() as db:
            db.execute(
                "DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM jobs"
                " WHERE stage = 'done' AND finished < ?)",
                (finished_before,),
            )
            return int(
                db.execute(
                    "DELETE FROM jobs WHERE stage = 'done' AND finished < ?", (finished_before,)
                ).rowcount
            )

    def waiting(self) -> dict[str, int]:
        now = self._clock()
        rows = self._read(
            "SELECT stage, count(*) AS n FROM jobs WHERE stage != 'done'"
            " AND (lease_owner IS NULL OR lease_expires < ?) GROUP BY stage",
            (now,),
        )
        return {row["stage"]: row["n"] for row in rows}

    def results_head(self) -> int:
        return int(self._read("SELECT value FROM counters WHERE name = 'done_seq'")[0][0])


def _next_done_seq(db: sqlite3.Connection) -> int:
    """The next place in the results feed (completion order). A counter, not max + 1: after
    purging every finished job the feed must still go on from where readers are."""
    row = db.execute(
        "UPDATE counters SET value = value + 1 WHERE name = 'done_seq' RETURNING value"
    ).fetchone()
    return int(row[0])


def _dump(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


def _merge_timing(row: sqlite3.Row, timing: dict[str, float] | None) -> str:
    return json.dumps(merged_timing(json.loads(row["timing"] or "{}"), timing))


def _record(row: sqlite3.Row) -> JobRecord:
    data = {key: row[key] for key in row.keys()}  # noqa: SIM118
    for key in JSON_COLUMNS:
        data[key] = json.loads(data[key]) if data[key] is not None else None
    return to_record(data)
