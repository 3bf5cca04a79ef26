"""What the SQL job store keeps and answers besides its state machine: jobs and the results
feed as they are read, the queue's figures, pages of jobs for the web viewer, a running
episode's events, the fleet's nodes, and the inference backends and pauses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollserve.schema.api import JobQuery, JobsPage
from rollserve.storage.base import JobEvent, JobRecord, NodeRecord, StoreEvent
from rollserve.storage.browse import SUMMARY_COLUMNS, order, summary, where
from rollserve.storage.sql.dialect import Dialect
from rollserve.storage.sql.rows import to_record


class SqlRecords:
    """The reading side of :class:`rollserve.storage.sql.store.SqlJobStore`, and the records that
    are not jobs."""

    def __init__(self, dialect: Dialect) -> None:
        self._db = dialect

    # -- jobs --------------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        rows = self._db.read("SELECT * FROM jobs WHERE job_id = :id", {"id": job_id})
        return to_record(rows[0]) if rows else None

    def results(self, after: int, limit: int) -> list[JobRecord]:
        rows = self._db.read(
            "SELECT * FROM jobs WHERE done_seq > :after ORDER BY done_seq LIMIT :limit",
            {"after": after, "limit": limit},
        )
        return [to_record(row) for row in rows]

    def results_head(self) -> int:
        return self._db.results_head()

    # -- nodes -------------------------------------------------------------------------------------

    def nodes(self) -> list[NodeRecord]:
        rows = self._db.read(
            "SELECT *, expires >= :now AS alive FROM nodes ORDER BY started, owner"
        )
        return [
            NodeRecord(
                owner=row["owner"],
                node_id=row["node_id"],
                info=row["info"],
                started=row["started"],
                seen=row["seen"],
                alive=bool(row["alive"]),
            )
            for row in rows
        ]

    def subscribe(self, on_event: Callable[[StoreEvent], None]) -> Callable[[], None]:
        return self._db.subscribe(on_event)

    # -- queue figures, browsing -------------------------------------------------------------------

    def waiting(self) -> dict[str, int]:
        rows = self._db.read(
            "SELECT stage, count(*) AS n FROM jobs WHERE stage <> 'done'"
            " AND (lease_owner IS NULL OR lease_expires < :now) GROUP BY stage"
        )
        return {row["stage"]: int(row["n"]) for row in rows}

    def counts(self) -> dict[str, int]:
        rows = self._db.read("SELECT status, count(*) AS n FROM jobs GROUP BY status")
        return {row["status"]: int(row["n"]) for row in rows}

    def list_jobs(self, query: JobQuery) -> JobsPage:
        clause, values = where(query, ":w{}")
        params = {f"w{i}": value for i, value in enumerate(values)}
        total = self._db.read(f"SELECT count(*) AS n FROM jobs{clause}", params)[0]["n"]
        rows = self._db.read(
            f"SELECT {SUMMARY_COLUMNS} FROM jobs{clause}{order(query)} LIMIT :limit OFFSET :offset",
            {**params, "limit": query.limit, "offset": query.offset},
        )
        jobs = [summary(row, row["timing"] or {}) for row in rows]
        return JobsPage(jobs=jobs, total=int(total), offset=query.offset, limit=query.limit)

    def append_event(self, job_id: str, attempt: int, turn: int, data: dict[str, Any]) -> None:
        self._db.write(
            "INSERT INTO job_events (job_id, attempt, turn, at, data)"
            " VALUES (:id, :attempt, :turn, :now, :data)",
            {"id": job_id, "attempt": attempt, "turn": turn, "data": self._db.json(data)},
        )

    def events(self, job_id: str) -> list[JobEvent]:
        rows = self._db.read(
            "SELECT seq, attempt, turn, at, data FROM job_events WHERE job_id = :id ORDER BY seq",
            {"id": job_id},
        )
        return [JobEvent(r["seq"], r["attempt"], r["turn"], r["at"], r["data"]) for r in rows]

    # -- inference backends ------------------------------------------------------------------------

    def save_backend(self, backend_id: str, spec: dict[str, Any]) -> None:
        self._db.write(
            "INSERT INTO backends (backend_id, spec, updated) VALUES (:id, :spec, :now)"
            " ON CONFLICT (backend_id) DO UPDATE SET spec = excluded.spec,"
            " updated = excluded.updated"
            f" RETURNING backend_id, {self._db.announce(StoreEvent.BACKENDS)}",
            {"id": backend_id, "spec": self._db.json(spec)},
        )

    def load_backends(self) -> list[dict[str, Any]]:
        rows = self._db.read("SELECT spec FROM backends ORDER BY updated, backend_id")
        return [row["spec"] for row in rows]

    def delete_backend(self, backend_id: str) -> bool:
        return bool(
            self._db.write(
                "DELETE FROM backends WHERE backend_id = :id"
                f" RETURNING backend_id, {self._db.announce(StoreEvent.BACKENDS)}",
                {"id": backend_id},
            )
        )

    def save_pause(self, model: str, pause: dict[str, Any] | None) -> None:
        announced = self._db.announce(StoreEvent.BACKENDS)
        if pause is None:
            self._db.write(
                f"DELETE FROM pauses WHERE model = :model RETURNING model, {announced}",
                {"model": model},
            )
            return
        self._db.write(
            "INSERT INTO pauses (model, pause, updated) VALUES (:model, :pause, :now)"
            " ON CONFLICT (model) DO UPDATE SET pause = excluded.pause,"
            f" updated = excluded.updated RETURNING model, {announced}",
            {"model": model, "pause": self._db.json(pause)},
        )

    def load_pauses(self) -> dict[str, dict[str, Any]]:
        rows = self._db.read("SELECT model, pause FROM pauses")
        return {row["model"]: row["pause"] for row in rows}

    def close(self) -> None:
        self._db.close()
