"""The job store on a SQL database: :class:`rollserve.storage.base.Store`'s state machine,
written once over a :class:`rollserve.storage.sql.dialect.Dialect` (SQLite, PostgreSQL).

What a worker does to a job it holds (advance, requeue, finish) is one statement guarded by
the lease: it changes the job only while that worker holds it. When it changes nothing, a
transaction reads the row under a lock to say why — no such job, the lease is lost, or a
cancel came and the job ends here. A claim picks and leases the next job in one statement; a
change announces itself to the other nodes as it commits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rollserve.errors import InvalidInputError, JobNotFoundError, LeaseLostError
from rollserve.storage.base import (
    NODES_KEPT_S,
    STAGE_STATUS,
    JobRecord,
    JobStatus,
    NewJob,
    Stage,
    StoreEvent,
    Submitted,
)
from rollserve.storage.sql.dialect import Dialect, Params, Row, Tx
from rollserve.storage.sql.records import SqlRecords
from rollserve.storage.sql.rows import (
    RECORD_COLUMNS,
    gone,
    held,
    released_to,
    to_record,
    waiting_for,
)
from rollserve.storage.sql.submit import submit

# The job ``:id`` is held by ``:owner`` (a job that ended is held by nobody).
_HELD = "job_id = :id AND lease_owner = :owner AND stage <> 'done'"
_UNLEASED = "lease_owner = NULL, lease_expires = NULL"


class SqlJobStore(SqlRecords):
    """:class:`rollserve.storage.base.Store` on the database of a dialect."""

    def submit(self, jobs: list[NewJob], *, max_queued: int) -> list[Submitted]:
        return submit(self._db, jobs, max_queued)

    # -- the stages --------------------------------------------------------------------------------

    def claim(self, stage: Stage, owner: str, lease_s: float) -> JobRecord | None:
        claimed = self.claim_many(stage, owner, lease_s, 1)
        return claimed[0] if claimed else None

    def claim_many(self, stage: Stage, owner: str, lease_s: float, limit: int) -> list[JobRecord]:
        if limit < 1:
            raise InvalidInputError(f"a claim takes at least 1 job, not limit={limit}")
        rows = self._db.write(
            "UPDATE jobs SET lease_owner = :owner, lease_expires = :now + :lease,"
            " status = :status, updated = :now, attempts = attempts"
            " + CASE WHEN :init OR lease_owner IS NOT NULL THEN 1 ELSE 0 END"  # (taken over)
            " WHERE seq IN (SELECT seq FROM jobs WHERE stage = :stage AND stage <> 'done'"
            " AND NOT cancel_requested AND (lease_owner IS NULL OR lease_expires < :now)"
            " AND (node IS NULL OR node = :owner) AND (not_before IS NULL OR not_before <= :now)"
            f" ORDER BY priority DESC, seq LIMIT :limit{self._db.skip_locked})"
            f" RETURNING seq, {RECORD_COLUMNS}",
            {
                "owner": owner,
                "lease": lease_s,
                "status": STAGE_STATUS[stage].value,
                "init": stage == Stage.INIT,
                "stage": stage.value,
                "limit": limit,
            },
        )
        # RETURNING keeps no order: the claim's own
        rows.sort(key=lambda row: (-row["priority"], row["seq"]))
        return [to_record(row) for row in rows]

    def heartbeat(
        self,
        job_ids: list[str],
        owner: str,
        lease_s: float,
        *,
        node: tuple[str, dict[str, Any]] | None = None,
    ) -> list[str]:
        db = self._db
        ids = db.among("job_id", "ids")
        renew = (
            f"UPDATE jobs SET lease_expires = :now + :lease WHERE {ids}"
            " AND lease_owner = :owner AND NOT cancel_requested"
        )
        beat = (
            "INSERT INTO nodes (owner, node_id, info, started, seen, expires)"
            " VALUES (:owner, :node_id, :info, :now, :now, :now + :lease) ON CONFLICT (owner)"
            " DO UPDATE SET info = excluded.info, seen = excluded.seen, expires = excluded.expires"
        )
        rows = db.write(
            f"SELECT job_id FROM jobs WHERE {ids} AND ((stage <> 'done' AND (cancel_requested"
            " OR (lease_owner IS NOT NULL AND lease_owner <> :owner)))"
            " OR (stage = 'done' AND status = 'cancelled'))",
            {
                "ids": db.listed(job_ids),
                "owner": owner,
                "lease": lease_s,
                "node_id": node[0] if node else None,
                "info": db.json(node[1] if node else None),
            },
            after=(renew, beat) if node is not None else (renew,),
        )
        return [row["job_id"] for row in rows]

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
        pinned = stage == Stage.RUN or stay  # run needs init's sandbox; stay, a kept layer
        announced = (
            "" if pinned else f", {self._db.announce(StoreEvent(stage.value))}"
        )  # (for this node)
        return (
            self._step(
                job_id,
                owner,
                f"UPDATE jobs SET stage = :stage, status = :status, {_UNLEASED}, node = :node,"
                f" stage_output = :output, timing = {self._db.merged('timing', 'timing')},"
                f" updated = :now WHERE {_HELD} AND NOT cancel_requested"
                f" RETURNING job_id{announced}",
                _handed_on(self._db, stage, owner if pinned else None, output, timing),
            )
            is not None
        )

    def pass_on(
        self,
        job: JobRecord,
        owner: str,
        stage: Stage,
        lease_s: float,
        *,
        output: dict[str, Any] | None = None,
        timing: dict[str, float] | None = None,
        stay: bool = False,
    ) -> JobRecord | None:
        node = owner if stage == Stage.RUN or stay else None
        # Only what the store decides comes back: the request and the output (a run's whole
        # trajectory) are the caller's already.
        rows = self._step(
            job.job_id,
            owner,
            f"UPDATE jobs SET stage = :stage, status = :status, lease_expires = :now + :lease,"
            f" node = :node, stage_output = :output,"
            f" timing = {self._db.merged('timing', 'timing')}, updated = :now"
            f" WHERE {_HELD} AND NOT cancel_requested RETURNING lease_expires, updated, timing",
            {**_handed_on(self._db, stage, node, output, timing), "lease": lease_s},
        )
        if rows is None:
            return None
        [row] = rows
        return dataclasses.replace(
            job,
            stage=stage,
            status=STAGE_STATUS[stage],
            lease_owner=owner,
            lease_expires=row["lease_expires"],
            node=node,
            cancel_requested=False,
            stage_output=output,
            timing=row["timing"] or {},
            updated=row["updated"],
        )

    def requeue(
        self,
        job_id: str,
        owner: str,
        stage: Stage,
        *,
        error: dict[str, Any] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        status, again = waiting_for(stage)
        self._step(
            job_id,
            owner,
            f"UPDATE jobs SET stage = :stage, status = :status, {_UNLEASED}, node = NULL,"
            " error = :error, updated = :now, not_before = :now + :delay,"
            f" attempts = attempts + :again WHERE {_HELD} AND NOT cancel_requested"
            f" RETURNING job_id, {self._db.announce(StoreEvent(stage.value))}",
            {
                "stage": stage.value,
                "status": status.value,
                "error": self._db.json(error),
                "delay": delay_s,
                "again": again,
            },
        )

    def _step(self, job_id: str, owner: str, sql: str, params: Params) -> list[Row] | None:
        """Run the step ``sql`` (guarded by _HELD, returning rows) on the job ``owner`` holds;
        its rows. None: a cancel came during the stage, and the job is now cancelled instead."""
        params = {**params, "id": job_id, "owner": owner}
        rows = self._db.write(sql, params)
        if rows:
            return rows
        with self._db.transaction() as tx:
            row = held(self._row(tx, job_id), job_id, owner)
            if row["cancel_requested"]:  # cancelled during the stage: it ends here
                self._end_cancelled(tx, row)
                return None
            return tx.query(sql, params)  # held after all: the row changed in between

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
        db = self._db
        params = {
            "id": job_id,
            "owner": owner,
            "status": status.value,
            "result": db.json(result),
            "error": db.json(error),
            "timing": db.json(timing or {}),
        }
        # The result holds the whole trajectory: no second copy of its turns.
        dropped = "DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM returned)"
        if owner is not None and db.write(
            self._ending(_HELD), params, after=(dropped,) if result is not None else ()
        ):
            return  # the usual case: the holder ends its job
        # Not held (a LeaseLostError), already done, or ended by the service (no owner).
        with db.transaction() as tx:
            if owner is None:
                row = self._row(tx, job_id)
                if row["lease_owner"] is not None and row["lease_expires"] >= tx.now:
                    raise LeaseLostError(f"job {job_id!r} is held by {row['lease_owner']}")
            else:
                row = held(self._row(tx, job_id), job_id, owner)
            if row["stage"] == Stage.DONE.value:
                return
            tx.query(self._ending("seq = :seq"), {**params, "seq": row["seq"]})
            if result is not None:
                tx.query("DELETE FROM job_events WHERE job_id = :id", params)

    def _ending(self, where: str) -> str:
        """The statement that ends the job ``where`` picks as ``:status``, with ``:result``,
        ``:error`` and ``:timing``, and gives it its place in the results feed."""
        return (
            f"UPDATE jobs SET stage = 'done', status = :status, {_UNLEASED}, node = NULL,"
            " stage_output = NULL, result = :result, error = :error,"
            f" timing = {self._db.merged('timing', 'timing')}, updated = :now, finished = :now,"
            f" done_seq = {self._db.feed_place} WHERE {where}"
            f" RETURNING job_id, {self._db.announce(StoreEvent.DONE)}"
        )

    # -- cancelling --------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> JobRecord:
        with self._db.transaction() as tx:
            self._cancel_row(tx, self._row(tx, job_id))
            return to_record(self._row(tx, job_id))

    def cancel_group(self, group_id: str) -> list[str]:
        with self._db.transaction() as tx:
            rows = tx.query(
                "SELECT * FROM jobs WHERE group_id = :group AND stage <> 'done'"
                f" ORDER BY seq{self._db.for_update}",
                {"group": group_id},
            )
            for row in rows:
                self._cancel_row(tx, row)
        return [row["job_id"] for row in rows]

    def _row(self, tx: Tx, job_id: str) -> Row:
        """The job's row, locked for the rest of the transaction."""
        rows = tx.query(
            f"SELECT * FROM jobs WHERE job_id = :id{self._db.for_update}", {"id": job_id}
        )
        if not rows:
            raise JobNotFoundError(f"no job {job_id!r}", job_id=job_id)
        return rows[0]

    def _cancel_row(self, tx: Tx, row: Row) -> None:
        """An unleased job ends at once; a leased one is flagged, and its worker ends it."""
        if row["stage"] == Stage.DONE.value:
            return
        if row["lease_owner"] is not None and row["lease_expires"] >= tx.now:
            tx.query(
                "UPDATE jobs SET cancel_requested = true, updated = :now WHERE seq = :seq"
                f" RETURNING seq, {self._db.announce(StoreEvent.CANCEL)}",  # its node stops at once
                {"seq": row["seq"]},
            )
            return
        self._end_cancelled(tx, row)

    def _end_cancelled(self, tx: Tx, row: Row) -> None:
        tx.query(
            f"UPDATE jobs SET stage = 'done', status = 'cancelled', cancel_requested = true,"
            f" {_UNLEASED}, node = NULL, stage_output = NULL, updated = :now, finished = :now,"
            f" done_seq = {self._db.feed_place} WHERE seq = :seq"
            f" RETURNING seq, {self._db.announce(StoreEvent.DONE)}",
            {"seq": row["seq"]},
        )

    # -- nodes that are gone, retention ------------------------------------------------------------

    def recover(self, alive: Callable[[str], bool]) -> list[str]:
        released = []
        with self._db.transaction() as tx:
            live = {
                row["owner"] for row in tx.query("SELECT owner FROM nodes WHERE expires >= :now")
            }
            rows = tx.query(
                "SELECT * FROM jobs WHERE stage <> 'done'"
                f" AND (lease_owner IS NOT NULL OR node IS NOT NULL){self._db.skip_locked}"
            )
            for row in rows:
                if gone(row, tx.now, live, alive):
                    self._release(tx, row)
                    released.append(row["job_id"])
            tx.query("DELETE FROM nodes WHERE expires < :now - :kept", {"kept": NODES_KEPT_S})
        return released

    def leave(self, owner: str) -> list[str]:
        with self._db.transaction() as tx:
            rows = tx.query(
                "SELECT * FROM jobs WHERE stage <> 'done' AND (lease_owner = :owner"
                f" OR node = :owner){self._db.for_update}",
                {"owner": owner},
            )
            for row in rows:
                self._release(tx, row)
            tx.query("DELETE FROM nodes WHERE owner = :owner", {"owner": owner})
        return [row["job_id"] for row in rows]

    def _release(self, tx: Tx, row: Row) -> None:
        """Give a job of a node that is gone back to the queue (or end it if it was cancelled).
        Its sandbox lived on that node: init and run start again; eval works from the stored
        run output in a fresh sandbox."""
        if row["cancel_requested"]:
            self._end_cancelled(tx, row)
            return
        stage = released_to(row["stage"])
        status, again = waiting_for(stage)
        tx.query(
            f"UPDATE jobs SET stage = :stage, status = :status, {_UNLEASED}, node = NULL,"
            " updated = :now, attempts = attempts + :again WHERE seq = :seq"
            f" RETURNING seq, {self._db.announce(StoreEvent(stage.value))}",
            {"stage": stage.value, "status": status.value, "again": again, "seq": row["seq"]},
        )

    def purge(self, finished_before: float) -> int:
        with self._db.transaction() as tx:
            ended = "stage = 'done' AND finished < :before"
            params = {"before": finished_before}
            tx.query(
                f"DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM jobs WHERE {ended})",
                params,
            )
            return tx.execute(f"DELETE FROM jobs WHERE {ended}", params)


def _handed_on(
    db: Dialect,
    stage: Stage,
    node: str | None,
    output: dict[str, Any] | None,
    timing: dict[str, float] | None,
) -> Params:
    """The parameters of a step that hands a job on to ``stage``."""
    return {
        "stage": stage.value,
        "status": STAGE_STATUS[stage].value,
        "node": node,
        "output": db.json(output),
        "timing": db.json(timing or {}),
    }
