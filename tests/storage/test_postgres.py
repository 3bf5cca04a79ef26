"""What only the PostgreSQL store does: its own schema versions, NOTIFY wake-ups across
connections, and riding out a database that goes away and comes back."""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollserve.errors import QueueFullError, StoreSchemaError, StoreUnavailableError
from rollserve.fixtures.postgres import TempPostgres
from rollserve.schema.api import JobQuery
from rollserve.storage import JobStatus, NewJob, SqliteJobStore, Stage
from rollserve.storage.postgres import PostgresJobStore
from rollserve.storage.postgres.schema import VERSION
from rollserve.storage.sqlite import SCHEMA_VERSION


def _events(store: PostgresJobStore) -> Iterator[queue.Queue[str]]:
    got: queue.Queue[str] = queue.Queue()
    stop = store.subscribe(got.put)
    assert got.get(timeout=5) == "*"  # listening (and: anything before may have been missed)
    yield got
    stop()


def _next(got: queue.Queue[str], timeout: float = 5.0) -> str:
    return got.get(timeout=timeout)


def test_a_newer_schema_is_refused_and_an_older_one_migrated(postgres: TempPostgres) -> None:
    url = postgres.create("schema_test")
    PostgresJobStore(url).close()  # creates version 1
    PostgresJobStore(url).close()  # and opens it again as it is
    postgres.sql("INSERT INTO rollserve_schema VALUES (99)", database="schema_test")
    with pytest.raises(
        StoreSchemaError, match=f"schema version 99; this rollserve knows up to {VERSION}"
    ):
        PostgresJobStore(url)


def test_sqlite_refuses_a_newer_schema_too(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SqliteJobStore(path).close()
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreSchemaError, match=f"knows up to {SCHEMA_VERSION}"):
        SqliteJobStore(path)


def test_changes_on_one_node_wake_the_others(pg_url: str) -> None:
    """Each change another connection commits is announced: work for init and eval, a job
    done, a cancel for the node that holds the job."""
    listener, other = PostgresJobStore(pg_url), PostgresJobStore(pg_url)
    try:
        events = _events(listener)
        got = next(events)
        other.submit([NewJob("a", {}), NewJob("b", {})], max_queued=10)
        assert _next(got) == "init"
        other.claim(Stage.INIT, "n", 30)
        other.advance("a", "n", Stage.EVAL, output={})
        assert _next(got) == "eval"
        other.claim(Stage.EVAL, "n", 30)
        other.finish("a", "n", JobStatus.COMPLETED, result={})
        assert _next(got) == "done"
        other.claim(Stage.INIT, "n", 30)
        other.cancel("b")
        assert _next(got) == "cancel"
        with pytest.raises(queue.Empty):
            got.get(timeout=0.3)  # nothing else happened
        next(events, None)
    finally:
        listener.close()
        other.close()


def test_the_store_rides_out_a_database_restart(postgres: TempPostgres) -> None:
    """The server is killed: calls fail with store_unavailable (never a hang, never another
    error); once it is back, the same store object works again and notifications resume.
    (A server of its own: the session's one stays up for the other tests.)"""
    server = TempPostgres().start()
    try:
        url = server.create("restart")
        store = PostgresJobStore(url, connect_timeout_s=2)
        events = _events(store)
        got = next(events)
        store.submit([NewJob("a", {})], max_queued=10)
        assert _next(got) == "init"
        server.kill()
        with pytest.raises(StoreUnavailableError, match="does not answer"):
            store.get("a")
        server.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                record = store.get("a")
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline, "the store did not come back"
                time.sleep(0.2)
        assert record is not None and record.status == JobStatus.QUEUED
        assert _next(got, 10) == "*"  # the listener reconnected and says it may have missed some
        store.submit([NewJob("b", {})], max_queued=10)
        assert _next(got) == "init"
        next(events, None)
        store.close()
    finally:
        server.close()


def test_an_unreachable_database_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(StoreUnavailableError, match="cannot reach the PostgreSQL store"):
        PostgresJobStore(f"postgresql://nobody@127.0.0.1:{port}/none", connect_timeout_s=2)


def test_an_older_schema_is_migrated_in_place(postgres: TempPostgres) -> None:
    """A database made by the first schema version gets the columns of the later ones and
    keeps its jobs, and its unfinished ones count against the queue's bound."""
    from rollserve.storage.postgres.schema import MIGRATIONS

    url = postgres.create("old_schema")
    postgres.sql(
        "CREATE TABLE rollserve_schema (version INTEGER NOT NULL); "
        + MIGRATIONS[0]
        + " INSERT INTO rollserve_schema VALUES (1);"
        + " INSERT INTO jobs (job_id, request, stage, status, created, updated)"
        + " VALUES ('old', '{}', 'init', 'queued', 0, 0);"
        + " INSERT INTO jobs (job_id, request, stage, status, created, updated, result)"
        + """ VALUES ('ended', '{"task": {"kind": "math"}}', 'done', 'completed', 0, 0,"""
        + """ '{"reward": 0.5, "turns": 2}');""",
        database="old_schema",
    )
    store = PostgresJobStore(url)
    try:
        store.submit([NewJob("new", {})], max_queued=10)
        claimed = store.claim(Stage.INIT, "n", 30)
        assert claimed is not None and claimed.job_id == "old"
        store.requeue("old", "n", Stage.INIT, delay_s=60)  # the new column is there
        [ended] = store.list_jobs(JobQuery(kind="math")).jobs  # and the generated ones
        assert (ended.job_id, ended.reward, ended.turns) == ("ended", 0.5, 2)
        with pytest.raises(QueueFullError, match="holds 2 unfinished"):  # old and new
            store.submit([NewJob("more", {})], max_queued=2)
    finally:
        store.close()


def test_an_older_sqlite_file_is_migrated_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as db:  # a file as schema version 2 left it: no not_before
        db.execute(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL"
            " UNIQUE, group_id TEXT, request TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0,"
            " stage TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
            " lease_owner TEXT, lease_expires REAL, node TEXT, cancel_requested INTEGER NOT"
            " NULL DEFAULT 0, stage_output TEXT, result TEXT, error TEXT, timing TEXT NOT NULL"
            " DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL, finished REAL,"
            " done_seq INTEGER UNIQUE)"
        )
        db.execute(
            "INSERT INTO jobs (job_id, request, stage, status, created, updated)"
            " VALUES ('old', '{}', 'init', 'queued', 0, 0)"
        )
        db.execute(
            "INSERT INTO jobs (job_id, request, stage, status, created, updated, result)"
            """ VALUES ('ended', '{"task": {"kind": "math"}}', 'done', 'completed', 0, 0,"""
            """ '{"reward": 0.5, "turns": 2}')"""
        )
        db.execute("PRAGMA user_version = 2")
    store = SqliteJobStore(path)
    try:
        claimed = store.claim(Stage.INIT, "n", 30)
        assert claimed is not None and claimed.job_id == "old"
        store.requeue("old", "n", Stage.INIT, delay_s=60)
        # The rebuilt table's generated columns hold the older jobs' figures.
        [ended] = store.list_jobs(JobQuery(kind="math")).jobs
        assert (ended.job_id, ended.reward, ended.turns) == ("ended", 0.5, 2)
        assert store.get("ended") is not None
    finally:
        store.close()


def test_plans_made_on_a_small_table_still_use_the_indexes(pg_url: str) -> None:
    """psycopg prepares a statement after five runs and PostgreSQL may keep the generic plan it
    made then; on an empty jobs table that plan is a sequential scan, which would read every
    job on every heartbeat and submit once the table has grown. The store's sessions plan
    index scans only, and never compile a statement."""
    store = PostgresJobStore(pg_url)
    try:
        store.submit([NewJob(f"j{i}", {}) for i in range(80)], max_queued=100)
        with store.dialect.connection() as conn:
            conn.execute("ANALYZE jobs")  # the table as it was when the plan was made
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute(  # the heartbeat's question: which of these jobs must stop
                "PREPARE renew(text[], text) AS SELECT job_id FROM jobs WHERE job_id = ANY($1)"
                " AND ((stage <> 'done' AND lease_owner <> $2) OR cancel_requested)"
            )
            plan = [row["QUERY PLAN"] for row in conn.execute("EXPLAIN EXECUTE renew('{a}', 'n')")]
            conn.execute("DEALLOCATE renew")
            conn.execute("RESET plan_cache_mode")
            jit = conn.execute("SHOW jit").fetchone()
        assert not any("Seq Scan on jobs" in line for line in plan), plan
        assert jit == {"jit": "off"}
    finally:
        store.close()
