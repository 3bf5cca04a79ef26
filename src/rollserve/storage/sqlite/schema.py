"""The SQLite store's schema: its version in ``PRAGMA user_version``, created and migrated in
place when the file is opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rollserve.errors import StoreSchemaError

# What the jobs table shows of its JSON: columns the web viewer filters and sorts on, kept by
# SQLite itself whenever a job is stored or ends.
_GENERATED = """
    kind TEXT GENERATED ALWAYS AS (json_extract(request, '$.task.kind')) STORED,
    task_id TEXT GENERATED ALWAYS AS (json_extract(request, '$.task.task_id')) STORED,
    model TEXT GENERATED ALWAYS AS (json_extract(request, '$.model')) STORED,
    reward REAL GENERATED ALWAYS AS (json_extract(result, '$.reward')) STORED,
    exit_reason TEXT GENERATED ALWAYS AS (json_extract(result, '$.exit_reason')) STORED,
    policy_version INTEGER GENERATED ALWAYS AS (json_extract(result, '$.max_policy_version'))
        STORED,
    turns INTEGER GENERATED ALWAYS AS (json_extract(result, '$.turns')) STORED,
    error_code TEXT GENERATED ALWAYS AS (json_extract(error, '$.code')) STORED""".strip()
# The small columns come first: a filter or a claim reads them without going through the
# overflow pages of a row's JSON (a trajectory can be megabytes).
_JOBS = """
CREATE TABLE IF NOT EXISTS {table} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    group_id TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    stage TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_expires REAL,
    node TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    finished REAL,
    done_seq INTEGER UNIQUE,
    not_before REAL,
    {generated},
    request TEXT NOT NULL,
    stage_output TEXT,
    result TEXT,
    error TEXT,
    timing TEXT NOT NULL DEFAULT '{{}}'
);
"""
# The columns a job is written with (the rest are generated from them).
_STORED_COLUMNS = (
    "seq, job_id, group_id, request, priority, stage, status, attempts, lease_owner,"
    " lease_expires, node, cancel_requested, stage_output, result, error, timing, created,"
    " updated, finished, done_seq, not_before"
)
_SCHEMA = """
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (stage, priority DESC, seq) WHERE stage != 'done';
CREATE INDEX IF NOT EXISTS jobs_group ON jobs (group_id) WHERE group_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, created);
CREATE INDEX IF NOT EXISTS jobs_kind ON jobs (kind, created);
CREATE INDEX IF NOT EXISTS jobs_reward ON jobs (reward);
CREATE INDEX IF NOT EXISTS jobs_exit ON jobs (exit_reason, created);
CREATE INDEX IF NOT EXISTS jobs_version ON jobs (policy_version);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished);
CREATE TABLE IF NOT EXISTS job_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job_id, seq);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters (name, value)
    SELECT 'done_seq', coalesce(max(done_seq), 0) FROM jobs;
-- The results feed's counter follows every place given (FEED_PLACE): a place is never given
-- twice, even once the jobs that had the latest are purged.
CREATE TRIGGER IF NOT EXISTS jobs_feed AFTER UPDATE OF done_seq ON jobs
    WHEN NEW.done_seq IS NOT NULL
    BEGIN
        UPDATE counters SET value = NEW.done_seq WHERE name = 'done_seq' AND value < NEW.done_seq;
    END;
CREATE TABLE IF NOT EXISTS backends (
    backend_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pauses (
    model TEXT PRIMARY KEY,
    pause TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    owner TEXT PRIMARY KEY,
    node_id TEXT NOT NULL,
    info TEXT NOT NULL DEFAULT '{}',
    started REAL NOT NULL,
    seen REAL NOT NULL,
    expires REAL NOT NULL
);
"""
SCHEMA_VERSION = 5  # PRAGMA user_version; 1 had no nodes, 2 no not_before, 3 no pauses,
# 4 neither the generated columns nor job_events


FEED_PLACE = "(SELECT value + 1 FROM counters WHERE name = 'done_seq')"
"""The next place in the results feed; the jobs_feed trigger counts it as given. One row's per
statement: the writer is alone, and the counter moves on when the row is written."""


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Create the schema, or bring an older file's to this version; a file of a newer version
    is refused (it is closed first). ``db`` is in autocommit mode."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        db.close()
        raise StoreSchemaError(
            f"{path} has schema version {version}; this rollserve knows up to "
            f"{SCHEMA_VERSION}: upgrade rollserve",
            found=version,
            known=SCHEMA_VERSION,
        )
    # A jobs table without the generated columns is rebuilt with them (SQLite adds stored
    # columns no other way).
    columns = {row[1] for row in db.execute("PRAGMA table_xinfo(jobs)")}
    if columns and "not_before" not in columns:  # a file of schema version 1 or 2
        db.execute("ALTER TABLE jobs ADD COLUMN not_before REAL")
    if columns and "kind" not in columns:
        db.execute("BEGIN IMMEDIATE")
        db.execute(_JOBS.format(table="jobs_new", generated=_GENERATED))
        db.execute(f"INSERT INTO jobs_new ({_STORED_COLUMNS}) SELECT {_STORED_COLUMNS} FROM jobs")
        db.execute("DROP TABLE jobs")
        db.execute("ALTER TABLE jobs_new RENAME TO jobs")
        db.execute("COMMIT")
    db.executescript(_JOBS.format(table="jobs", generated=_GENERATED) + _SCHEMA)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
