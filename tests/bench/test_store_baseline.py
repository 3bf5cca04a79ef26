"""The baseline of ``rollserve bench store``: pgbench's script holds the statements the store
sends for a round of lifecycles, in order, and its lifecycles end their jobs as the store's
do."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from rollserve.bench.pgbench import lifecycle_script, pgbench_path, run_pgbench
from rollserve.errors import InvalidInputError
from rollserve.settings import Settings
from rollserve.storage import JobStatus, NewJob, Stage
from rollserve.storage.postgres.dialect import PgTx, PostgresDialect
from rollserve.storage.registry import open_store
from tests.missing import missing


def _shape(sql: str) -> str:
    """What a statement does, from its first words: 'UPDATE jobs', 'WITH returned AS (SELECT';
    pgbench's claim, folded into one row ('WITH claimed AS (UPDATE jobs'), as 'UPDATE jobs'."""
    words = re.sub(r"\s+", " ", sql).strip().split(" ")
    if words[:3] == ["WITH", "claimed", "AS"]:
        words = [words[3].lstrip("("), *words[4:]]
    return " ".join(words[:4] if words[0] == "WITH" else words[:2]).upper()


def _script_statements(batch: int, got: int) -> list[str]:
    """The SQL commands of the pgbench script for rounds of ``batch`` jobs, as pgbench runs
    them where the claim took ``got`` (its other backslash commands and comments left out; a
    query that ends in ``\\gset`` ends there)."""
    kept, skipping = [], False
    for line in lifecycle_script(batch).splitlines():
        if found := re.fullmatch(r"\\if :got >= (\d+)", line.strip()):
            skipping = int(found.group(1)) > got
        elif line.strip() == "\\endif":
            skipping = False
        elif not skipping and not line.lstrip().startswith(("--", "\\")):
            kept.append(line.replace("\\gset", ";"))
    return [s.strip() for s in "\n".join(kept).split(";") if s.strip()]


def test_the_script_sends_the_statements_the_store_sends(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    one = PostgresDialect._one
    query = PgTx.query

    def recorded_one(self: PostgresDialect, sql: str, params: Any) -> Any:
        sent.append(self.statement(sql).decode())
        return one(self, sql, params)

    def recorded_query(self: PgTx, sql: str, params: Any = None) -> Any:
        sent.append(sql)
        return query(self, sql, params or {})

    store = open_store(Settings(store_url=pg_url))
    monkeypatch.setattr(PostgresDialect, "_one", recorded_one)
    monkeypatch.setattr(PgTx, "query", recorded_query)
    try:  # a round of two lifecycles, as bench store's clients make it
        store.submit([NewJob(i, {"task": {"task_id": i}}) for i in "ab"], max_queued=10**9)
        claimed = store.claim_many(Stage.INIT, "n", 60, 3)
        assert [job.job_id for job in claimed] == ["a", "b"]
        runs = [store.pass_on(job, "n", Stage.RUN, 60, timing={}) for job in claimed]
        evals = [store.pass_on(run, "n", Stage.EVAL, 60, output={}) for run in runs if run]
        assert all(evals)
        store.heartbeat(["a", "b"], "n", 60)
        for job_id in "ab":
            store.finish(job_id, "n", JobStatus.COMPLETED, result={})
    finally:
        monkeypatch.undo()
        store.close()
    assert [_shape(s) for s in _script_statements(3, got=2)] == [_shape(s) for s in sent]
    assert [_shape(s) for s in sent] == [
        "INSERT INTO",
        "UPDATE JOBS",
        *["UPDATE JOBS"] * 4,
        "WITH RETURNED AS (SELECT",
        *["WITH RETURNED AS (UPDATE"] * 2,
    ]
    with pytest.raises(InvalidInputError, match="batch=0"):
        lifecycle_script(0)


def test_pgbench_lifecycles_end_their_jobs(pg_url: str) -> None:
    if pgbench_path() is None:
        missing("pgbench is not installed (make setup installs PostgreSQL)")
    open_store(Settings(store_url=pg_url)).close()  # the schema
    step = run_pgbench(pg_url, 2, 1, request_bytes=500, batch=3)
    assert step.lifecycles > 0 and step.seconds > 0
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT stage, status, attempts, result::text, lease_owner,"
            " length(request #>> '{task,text}') FROM jobs"
            " WHERE job_id LIKE 'pg-%' AND stage = 'done'"
        ).fetchall()
    assert len(rows) == step.lifecycles
    assert set(rows) == {("done", "completed", 1, "{}", None, 500)}
