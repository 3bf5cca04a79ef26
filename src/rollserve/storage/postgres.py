"""The job store on PostgreSQL: the shared state of a fleet of nodes.

Workers claim with ``FOR UPDATE SKIP LOCKED``; time is the database's; the results feed's
cursor is a sequence drawn under a transaction lock, so places in the feed are committed in
their order and a reader never passes one that is still to appear. Changes are announced with
``NOTIFY`` so that long-polls and idle workers on every node wake at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb

from rollserve.errors import JobConflictError, JobNotFoundError, LeaseLostError, QueueFullError
from rollserve.storage.base import (
    NODES_KEPT_S,
    STAGE_STATUS,
    JobRecord,
    JobStatus,
    NewJob,
    Stage,
    Submitted,
)
from rollserve.storage.pg_browse import PgBrowsing
from rollserve.storage.pg_connection import Cursor, first, json_or_none
from rollserve.storage.pg_schema import CHANNEL, FEED_LOCK
from rollserve.storage.rows import (
    gone,
    held,
    merged_timing,
    released_to,
    to_record,
    waiting_for,
)

_UNFINISHED = "stage <> 'done'"
# The statement's time: the caller's clock (a test's) when given, else the database's.
_T = "t AS (SELECT coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())) AS now)"


class PostgresJobStore(PgBrowsing):
    """:class:`rollserve.storage.base.Store` on a PostgreSQL database shared by nodes."""

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, jobs: list[NewJob], *, max_queued: int) -> list[Submitted]:
        ids = [job.job_id for job in jobs]
        if jobs and len(set(ids)) == len(ids):
            # The usual case, new ids under the bound, is one statement; anything else (ids
            # seen before, a full queue, a race with another node) is decided below.
            rows = self._one(
                f"WITH {_T}, n AS (SELECT * FROM unnest(%(ids)s::text[], %(groups)s::text[],"
                " %(requests)s::jsonb[], %(priorities)s::int[]) WITH ORDINALITY"
                " AS n(job_id, group_id, request, priority, ord)),"
                " ins AS (INSERT INTO jobs (job_id, group_id, request, priority, stage, status,"
                " created, updated) SELECT n.job_id, n.group_id, n.request, n.priority, 'init',"
                " 'queued', t.now, t.now FROM n, t"
                " WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE job_id = ANY(%(ids)s))"
                f" AND (SELECT count(*) FROM jobs WHERE {_UNFINISHED}) + %(k)s <= %(max)s"
                " ORDER BY n.ord ON CONFLICT (job_id) DO NOTHING RETURNING job_id)"
                " SELECT job_id, (SELECT count(pg_notify(%(channel)s, 'init'))"
                " FROM (SELECT 1 FROM ins LIMIT 1) AS one) AS notified FROM ins",
                {
                    "ids": ids,
                    "groups": [job.group_id for job in jobs],
                    "requests": [Jsonb(job.request) for job in jobs],
                    "priorities": [job.priority for job in jobs],
                    "k": len(jobs),
                    "max": max_queued,
                    "channel": CHANNEL,
                },
            )
            stored = {row["job_id"] for row in rows}
            if len(stored) == len(ids):
                return [Submitted(job_id, JobStatus.QUEUED, created=True) for job_id in ids]
            if stored:  # another node stored some of the same ids meanwhile: its jobs stand
                rest = self.submit(
                    [job for job in jobs if job.job_id not in stored], max_queued=max_queued
                )
                decided = {s.job_id: s for s in rest}
                return [
                    decided.get(job_id, Submitted(job_id, JobStatus.QUEUED, created=True))
                    for job_id in ids
                ]
        return self._submit_checked(jobs, max_queued=max_queued)

    def _submit_checked(self, jobs: list[NewJob], *, max_queued: int) -> list[Submitted]:
        """Submit, job by job: ids seen before (the same request again, or a conflict),
        duplicates within the batch, the queue's bound."""
        out: list[Submitted] = []
        fresh: dict[str, NewJob] = {}
        with self._tx() as cur:
            now = self._now(cur)
            ids = list({job.job_id for job in jobs})
            cur.execute("SELECT job_id, request, status FROM jobs WHERE job_id = ANY(%s)", (ids,))
            known = {row["job_id"]: row for row in cur.fetchall()}
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
            cur.execute(f"SELECT count(*) AS n FROM jobs WHERE {_UNFINISHED}")
            waiting = int(first(cur)["n"])
            if waiting + len(fresh) > max_queued:
                raise QueueFullError(
                    f"the queue holds {waiting} unfinished jobs; {len(fresh)} more would pass "
                    f"its bound of {max_queued}",
                    queued=waiting,
                    bound=max_queued,
                )
            cur.executemany(
                "INSERT INTO jobs (job_id, group_id, request, priority, stage, status, created,"
                " updated) VALUES (%s, %s, %s, %s, 'init', 'queued', %s, %s)"
                " ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
                [
                    (j.job_id, j.group_id, Jsonb(j.request), j.priority, now, now)
                    for j in fresh.values()
                ],
                returning=True,
            )
            stored: set[str] = set()
            while True:
                stored.update(row["job_id"] for row in cur.fetchall())
                if not cur.nextset():
                    break
            self._notify(cur, Stage.INIT.value)
        raced = [job_id for job_id in fresh if job_id not in stored]
        if raced:  # another node stored the same ids in between: its jobs stand
            again = self._submit_checked([fresh[job_id] for job_id in raced], max_queued=max_queued)
            known_now = {s.job_id: s for s in again}
            out = [known_now.get(s.job_id, s) for s in out]
        return out

    def get(self, job_id: str) -> JobRecord | None:
        rows = self._one("SELECT * FROM jobs WHERE job_id = %(id)s", {"id": job_id})
        return to_record(rows[0]) if rows else None

    def claim(self, stage: Stage, owner: str, lease_s: float) -> JobRecord | None:
        rows = self._one(
            f"WITH {_T}, pick AS (SELECT seq FROM jobs, t WHERE stage = %(stage)s AND {_UNFINISHED}"
            " AND NOT cancel_requested AND (lease_owner IS NULL OR lease_expires < t.now)"
            " AND (node IS NULL OR node = %(owner)s)"
            " AND (not_before IS NULL OR not_before <= t.now)"
            " ORDER BY priority DESC, seq LIMIT 1 FOR UPDATE OF jobs SKIP LOCKED)"
            " UPDATE jobs SET lease_owner = %(owner)s, lease_expires = t.now + %(lease)s,"
            " status = %(status)s, updated = t.now, attempts = jobs.attempts + CASE WHEN"
            " %(init)s OR jobs.lease_owner IS NOT NULL THEN 1 ELSE 0 END"
            " FROM t, pick WHERE jobs.seq = pick.seq RETURNING jobs.*",
            {
                "owner": owner,
                "lease": lease_s,
                "status": STAGE_STATUS[stage].value,
                "init": stage == Stage.INIT,
                "stage": stage.value,
            },
        )
        return to_record(rows[0]) if rows else None

    def heartbeat(
        self,
        job_ids: list[str],
        owner: str,
        lease_s: float,
        *,
        node: tuple[str, dict[str, Any]] | None = None,
    ) -> list[str]:
        rows = self._one(
            f"WITH {_T}, beat AS (INSERT INTO nodes (owner, node_id, info, started, seen,"
            " expires) SELECT %(owner)s, %(name)s, %(info)s, t.now, t.now, t.now + %(lease)s"
            " FROM t WHERE %(beat)s ON CONFLICT (owner) DO UPDATE SET info = excluded.info,"
            " seen = excluded.seen, expires = excluded.expires),"
            " renew AS (UPDATE jobs SET lease_expires = t.now + %(lease)s FROM t"
            " WHERE job_id = ANY(%(ids)s) AND lease_owner = %(owner)s AND NOT cancel_requested)"
            " SELECT job_id FROM jobs WHERE job_id = ANY(%(ids)s) AND ("
            f" ({_UNFINISHED} AND lease_owner IS NOT NULL AND lease_owner <> %(owner)s)"
            f" OR ({_UNFINISHED} AND cancel_requested)"
            " OR (stage = 'done' AND status = 'cancelled'))",
            {
                "owner": owner,
                "lease": lease_s,
                "ids": job_ids,
                "beat": node is not None,
                "name": node[0] if node else "",
                "info": Jsonb(node[1] if node else {}),
            },
        )
        return [row["job_id"] for row in rows]

    def _held(self, cur: Cursor, job_id: str, owner: str) -> dict[str, Any]:
        cur.execute("SELECT * FROM jobs WHERE job_id = %s FOR UPDATE", (job_id,))
        row = cur.fetchone()
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
        moved = self._one(
            f"WITH {_T}, moved AS (UPDATE jobs SET stage = %(stage)s, status = %(status)s,"
            " lease_owner = NULL, lease_expires = NULL, node = %(node)s,"
            " stage_output = %(output)s, timing = timing || %(timing)s, updated = t.now FROM t"
            f" WHERE job_id = %(id)s AND lease_owner = %(owner)s AND {_UNFINISHED}"
            " AND NOT cancel_requested RETURNING 1)"
            " SELECT (SELECT count(*) FROM moved) AS n,"
            " (SELECT count(pg_notify(%(channel)s, %(stage)s)) FROM moved WHERE %(announce)s)",
            {
                "stage": stage.value,
                "status": STAGE_STATUS[stage].value,
                "node": owner if stage == Stage.RUN or stay else None,  # run: init's sandbox
                "output": json_or_none(output),
                "timing": Jsonb(timing or {}),
                "id": job_id,
                "owner": owner,
                "channel": CHANNEL,
                "announce": stage != Stage.RUN and not stay,  # claimed by this node only
            },
        )
        if moved[0]["n"]:
            return True
        # Not held, or cancelled during the stage: find out which, under a row lock.
        with self._tx() as cur:
            now = self._now(cur)
            row = self._held(cur, job_id, owner)
            if row["cancel_requested"]:  # cancelled during the stage: it ends here
                self._end_cancelled(cur, row, now)
                return False
            cur.execute(
                "UPDATE jobs SET stage = %s, status = %s, lease_owner = NULL,"
                " lease_expires = NULL, node = %s, stage_output = %s, timing = %s, updated = %s"
                " WHERE seq = %s",
                (
                    stage.value,
                    STAGE_STATUS[stage].value,
                    owner if stage == Stage.RUN else None,  # run needs init's sandbox
                    json_or_none(output),
                    Jsonb(merged_timing(row["timing"], timing)),
                    now,
                    row["seq"],
                ),
            )
            if stage != Stage.RUN:
                self._notify(cur, stage.value)
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
        if owner is not None:  # the usual case: the holder ends its job, in one statement
            done = self._one(
                f"WITH {_T}, done AS (UPDATE jobs SET stage = 'done', status = %(status)s,"
                " lease_owner = NULL, lease_expires = NULL, node = NULL, stage_output = NULL,"
                " result = %(result)s, error = %(error)s, timing = timing || %(timing)s,"
                " updated = t.now, finished = t.now, done_seq = (SELECT nextval('jobs_done_seq')"
                " FROM (SELECT pg_advisory_xact_lock(%(lock)s)) AS l) FROM t"
                f" WHERE job_id = %(id)s AND lease_owner = %(owner)s AND {_UNFINISHED}"
                " RETURNING 1),"
                # the result holds the whole trajectory: no second copy of its turns
                " dropped AS (DELETE FROM job_events WHERE job_id = %(id)s"
                " AND %(result)s::jsonb IS NOT NULL AND EXISTS (SELECT 1 FROM done))"
                " SELECT (SELECT count(*) FROM done) AS n,"
                " (SELECT count(pg_notify(%(channel)s, 'done')) FROM done)",
                {
                    "status": status.value,
                    "result": json_or_none(result),
                    "error": json_or_none(error),
                    "timing": Jsonb(timing or {}),
                    "lock": FEED_LOCK,
                    "id": job_id,
                    "owner": owner,
                    "channel": CHANNEL,
                },
            )
            if done[0]["n"]:
                return
        # Not held (a LeaseLostError), already done, or ended by the service (no owner).
        with self._tx() as cur:
            now = self._now(cur)
            if owner is None:
                cur.execute("SELECT * FROM jobs WHERE job_id = %s FOR UPDATE", (job_id,))
                row = cur.fetchone()
                if row is None:
                    raise JobNotFoundError(f"no job {job_id!r}", job_id=job_id)
                if row["lease_owner"] is not None and row["lease_expires"] >= now:
                    raise LeaseLostError(f"job {job_id!r} is held by {row['lease_owner']}")
            else:
                row = self._held(cur, job_id, owner)
            if row["stage"] == Stage.DONE.value:
                return
            cur.execute(
                "UPDATE jobs SET stage = 'done', status = %s, lease_owner = NULL,"
                " lease_expires = NULL, node = NULL, stage_output = NULL, result = %s,"
                " error = %s, timing = %s, updated = %s, finished = %s, done_seq = %s"
                " WHERE seq = %s",
                (
                    status.value,
                    json_or_none(result),
                    json_or_none(error),
                    Jsonb(merged_timing(row["timing"], timing)),
                    now,
                    now,
                    self._feed_place(cur),
                    row["seq"],
                ),
            )
            if result is not None:
                cur.execute("DELETE FROM job_events WHERE job_id = %s", (job_id,))
            self._notify(cur, "done")

    def requeue(
        self,
        job_id: str,
        owner: str,
        stage: Stage,
        *,
        error: dict[str, Any] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        with self._tx() as cur:
            now = self._now(cur)
            row = self._held(cur, job_id, owner)
            if row["cancel_requested"]:
                self._end_cancelled(cur, row, now)
                return
            status, again = waiting_for(stage)
            cur.execute(
                "UPDATE jobs SET stage = %s, status = %s, lease_owner = NULL,"
                " lease_expires = NULL, node = NULL, error = %s, updated = %s, not_before = %s,"
                " attempts = attempts + %s WHERE seq = %s",
                (
                    stage.value,
                    status.value,
                    json_or_none(error),
                    now,
                    now + delay_s,
                    again,
                    row["seq"],
                ),
            )
            self._notify(cur, stage.value)

    def cancel(self, job_id: str) -> JobRecord:
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute("SELECT * FROM jobs WHERE job_id = %s FOR UPDATE", (job_id,))
            row = cur.fetchone()
            if row is None:
                raise JobNotFoundError(f"no job {job_id!r}", job_id=job_id)
            self._cancel_row(cur, row, now)
            cur.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,))
            return to_record(first(cur))

    def _cancel_row(self, cur: Cursor, row: dict[str, Any], now: float) -> None:
        if row["stage"] == Stage.DONE.value:
            return
        if row["lease_owner"] is not None and row["lease_expires"] >= now:
            cur.execute(
                "UPDATE jobs SET cancel_requested = true, updated = %s WHERE seq = %s",
                (now, row["seq"]),
            )
            self._notify(cur, "cancel")  # its node stops the work at once
            return
        self._end_cancelled(cur, row, now)

    def _end_cancelled(self, cur: Cursor, row: dict[str, Any], now: float) -> None:
        cur.execute(
            "UPDATE jobs SET stage = 'done', status = 'cancelled', cancel_requested = true,"
            " lease_owner = NULL, lease_expires = NULL, node = NULL, stage_output = NULL,"
            " updated = %s, finished = %s, done_seq = %s WHERE seq = %s",
            (now, now, self._feed_place(cur), row["seq"]),
        )
        self._notify(cur, "done")

    def cancel_group(self, group_id: str) -> list[str]:
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute(
                f"SELECT * FROM jobs WHERE group_id = %s AND {_UNFINISHED} ORDER BY seq FOR UPDATE",
                (group_id,),
            )
            rows = cur.fetchall()
            for row in rows:
                self._cancel_row(cur, row, now)
        return [row["job_id"] for row in rows]

    def results(self, after: int, limit: int) -> list[JobRecord]:
        with self._tx() as cur:
            cur.execute(
                "SELECT * FROM jobs WHERE done_seq > %s ORDER BY done_seq LIMIT %s", (after, limit)
            )
            return [to_record(row) for row in cur.fetchall()]

    def results_head(self) -> int:
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock_shared(%s)", (FEED_LOCK,))
            cur.execute(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS head FROM jobs_done_seq"
            )
            return int(first(cur)["head"])

    # -- nodes -----------------------------------------------------------------------------------

    def recover(self, alive: Callable[[str], bool]) -> list[str]:
        released = []
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute("SELECT owner FROM nodes WHERE expires >= %s", (now,))
            live = {row["owner"] for row in cur.fetchall()}
            cur.execute(
                f"SELECT * FROM jobs WHERE {_UNFINISHED}"
                " AND (lease_owner IS NOT NULL OR node IS NOT NULL) FOR UPDATE SKIP LOCKED"
            )
            for row in cur.fetchall():
                if not gone(row, now, live, alive):
                    continue
                self._release(cur, row, now)
                released.append(row["job_id"])
            cur.execute("DELETE FROM nodes WHERE expires < %s", (now - NODES_KEPT_S,))
        return released

    def _release(self, cur: Cursor, row: dict[str, Any], now: float) -> None:
        """A job of a node that is gone goes back to the queue (init, or eval from the stored
        run output), or ends if a client cancelled it."""
        if row["cancel_requested"]:
            self._end_cancelled(cur, row, now)
            return
        stage = released_to(row["stage"])
        status, again = waiting_for(stage)
        cur.execute(
            "UPDATE jobs SET stage = %s, status = %s, lease_owner = NULL, lease_expires = NULL,"
            " node = NULL, updated = %s, attempts = attempts + %s WHERE seq = %s",
            (stage.value, status.value, now, again, row["seq"]),
        )
        self._notify(cur, stage.value)

    def leave(self, owner: str) -> list[str]:
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute(
                f"SELECT * FROM jobs WHERE {_UNFINISHED} AND (lease_owner = %s OR node = %s)"
                " FOR UPDATE",
                (owner, owner),
            )
            rows = cur.fetchall()
            for row in rows:
                self._release(cur, row, now)
            cur.execute("DELETE FROM nodes WHERE owner = %s", (owner,))
        return [row["job_id"] for row in rows]

    # -- queue figures and retention --------------------------------------------------------------

    def purge(self, finished_before: float) -> int:
        with self._tx() as cur:
            cur.execute(
                "DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM jobs"
                " WHERE stage = 'done' AND finished < %s)",
                (finished_before,),
            )
            cur.execute(
                "DELETE FROM jobs WHERE stage = 'done' AND finished < %s", (finished_before,)
            )
            return cur.rowcount

    def waiting(self) -> dict[str, int]:
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute(
                f"SELECT stage, count(*) AS n FROM jobs WHERE {_UNFINISHED}"
                " AND (lease_owner IS NULL OR lease_expires < %s) GROUP BY stage",
                (now,),
            )
            return {row["stage"]: int(row["n"]) for row in cur.fetchall()}
