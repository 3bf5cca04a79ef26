"""The baseline of ``rollserve bench store``: pgbench's script holds the statements the store
sends for one lifecycle, in order, and its lifecycles end their jobs as the store's do."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from rollserve.bench.pgbench import lifecycle_script, pgbench_path, run_pgbench
from rollserve.settings import Settings
from rollserve.storage import JobStatus, NewJob, Stage
from rollserve.storage.postgres.dialect import PgTx, PostgresDialect
from rollserve.storage.registry import open_store
from tests.missing import missing


def _shape(sql: str) -> str:
    """What a statement does, from its first words: 'UPDATE jobs', 'WITH returned AS (SELECT'."""
    words = re.sub(r"\s+", " ", sql).strip().split(" ")
    return " ".join(words[:4] if words[0] == "WITH" else words[:2]).upper()


def _script_statements() -> list[str]:
    """The SQL commands of the pgbench script (its backslash commands and comments left out;
    a query that ends in ``\\aset`` ends there)."""
    lines = [
        line.replace("\\aset", ";")
        for line in lifecycle_script().splitlines()
        if not line.lstrip().startswith(("--", "\\"))
    ]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


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
    try:  # one lifecycle, as bench store's clients make it
        store.submit([NewJob("a", {"task": {"task_id": "a"}})], max_queued=10**9)
        claimed = store.claim(Stage.INIT, "n", 60)
        assert claimed is not None
        run = store.pass_on(claimed, "n", Stage.RUN, 60, timing={})
        assert run is not None
        assert store.pass_on(run, "n", Stage.EVAL, 60, output={}) is not None
        store.heartbeat(["a"], "n", 60)
        store.finish("a", "n", JobStatus.COMPLETED, result={})
    finally:
        monkeypatch.undo()
        store.close()
    script = _script_statements()
    assert [_shape(s) for s in script] == [_shape(s) for s in sent]
    assert [_shape(s) for s in sent] == [
        "INSERT INTO",
        "UPDATE JOBS",
        "UPDATE JOBS",
        "UPDATE JOBS",
        "WITH RETURNED AS (SELECT",
        "WITH RETURNED AS (UPDATE",
    ]


def test_pgbench_lifecycles_end_their_jobs(pg_url: str) -> None:
    if pgbench_path() is None:
        missing("pgbench is not installed (make setup installs PostgreSQL)")
    open_store(Settings(store_url=pg_url)).close()  # the schema
    step = run_pgbench(pg_url, 2, 1, request_bytes=500)
    assert step.lifecycles > 0 and step.seconds > 0
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT stage, status, attempts, result::text, lease_owner,"
            " length(request #>> '{task,text}') FROM jobs"
            " WHERE job_id LIKE 'pg-%' AND stage = 'done'"
        ).fetchall()
    assert len(rows) == step.lifecycles
    assert set(rows) == {("done", "completed", 1, "{}", None, 500)}
