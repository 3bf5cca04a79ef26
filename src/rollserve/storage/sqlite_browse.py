"""Browsing the SQLite store: jobs by status, pages of jobs for the web viewer, and a running
episode's events."""

from __future__ import annotations

import json
from typing import Any

from rollserve.schema.api import JobQuery, JobsPage
from rollserve.storage.browse import SUMMARY_COLUMNS, JobEvent, order, summary, where
from rollserve.storage.sqlite_connection import SqliteConnection


class SqliteBrowsing(SqliteConnection):
    """The reading side of :class:`rollserve.storage.sqlite.SqliteJobStore`."""

    def counts(self) -> dict[str, int]:
        rows = self._read("SELECT status, count(*) AS n FROM jobs GROUP BY status")
        return {row["status"]: row["n"] for row in rows}

    def list_jobs(self, query: JobQuery) -> JobsPage:
        clause, params = where(query, "?")
        with self._lock, self._answering():
            total = self._db.execute(f"SELECT count(*) FROM jobs{clause}", params).fetchone()[0]
            rows = self._db.execute(
                f"SELECT {SUMMARY_COLUMNS} FROM jobs{clause}{order(query)} LIMIT ? OFFSET ?",
                [*params, query.limit, query.offset],
            ).fetchall()
        jobs = [summary(row, json.loads(row["timing"] or "{}")) for row in rows]
        return JobsPage(jobs=jobs, total=int(total), offset=query.offset, limit=query.limit)

    def append_event(self, job_id: str, attempt: int, turn: int, data: dict[str, Any]) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO job_events (job_id, attempt, turn, at, data) VALUES (?, ?, ?, ?, ?)",
                (job_id, attempt, turn, self._clock(), json.dumps(data)),
            )

    def events(self, job_id: str) -> list[JobEvent]:
        rows = self._read(
            "SELECT seq, attempt, turn, at, data FROM job_events WHERE job_id = ? ORDER BY seq",
            (job_id,),
        )
        return [
            JobEvent(r["seq"], r["attempt"], r["turn"], r["at"], json.loads(r["data"]))
            for r in rows
        ]
