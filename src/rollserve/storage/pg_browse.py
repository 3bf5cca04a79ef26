"""Browsing the PostgreSQL store: jobs by status, pages of jobs for the web viewer, and a
running episode's events."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from rollserve.schema.api import JobQuery, JobsPage
from rollserve.storage.browse import SUMMARY_COLUMNS, JobEvent, order, summary, where
from rollserve.storage.pg_connection import PgConnection, first


class PgBrowsing(PgConnection):
    """The reading side of :class:`rollserve.storage.postgres.PostgresJobStore`."""

    def counts(self) -> dict[str, int]:
        with self._tx() as cur:
            cur.execute("SELECT status, count(*) AS n FROM jobs GROUP BY status")
            return {row["status"]: int(row["n"]) for row in cur.fetchall()}

    def list_jobs(self, query: JobQuery) -> JobsPage:
        clause, params = where(query, "%s")
        with self._tx() as cur:
            cur.execute(f"SELECT count(*) AS n FROM jobs{clause}".encode(), params)
            total = int(first(cur)["n"])
            cur.execute(
                f"SELECT {SUMMARY_COLUMNS} FROM jobs{clause}{order(query)}"
                " LIMIT %s OFFSET %s".encode(),
                [*params, query.limit, query.offset],
            )
            rows = cur.fetchall()
        jobs = [summary(row, row["timing"] or {}) for row in rows]
        return JobsPage(jobs=jobs, total=total, offset=query.offset, limit=query.limit)

    def append_event(self, job_id: str, attempt: int, turn: int, data: dict[str, Any]) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO job_events (job_id, attempt, turn, at, data)"
                " VALUES (%s, %s, %s, %s, %s)",
                (job_id, attempt, turn, self._now(cur), Jsonb(data)),
            )

    def events(self, job_id: str) -> list[JobEvent]:
        with self._tx() as cur:
            cur.execute(
                "SELECT seq, attempt, turn, at, data FROM job_events WHERE job_id = %s"
                " ORDER BY seq",
                (job_id,),
            )
            rows = cur.fetchall()
        return [JobEvent(r["seq"], r["attempt"], r["turn"], r["at"], r["data"]) for r in rows]
