"""The PostgreSQL store's schema, created and migrated by rollserve itself.

``rollserve_schema`` holds the version the database is at; each migration brings it one
version on, in one transaction, under an advisory lock so that nodes starting together migrate
once. A database at a newer version than this code knows is refused: an older rollserve must
not write into a layout it does not know.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import tuple_row

from rollserve.errors import StoreSchemaError

CHANNEL = "rollserve"  # NOTIFY channel of job changes
FEED_LOCK = 0x726F6C6C  # advisory lock that orders places in the results feed
_SCHEMA_LOCK = 0x726F6C6D  # advisory lock held while migrating

MIGRATIONS: list[str] = [
    # 1: jobs, the results feed's sequence, inference backends, nodes.
    """
    CREATE TABLE jobs (
        seq BIGSERIAL PRIMARY KEY,
        job_id TEXT NOT NULL UNIQUE,
        group_id TEXT,
        request JSONB NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        stage TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires DOUBLE PRECISION,
        node TEXT,
        cancel_requested BOOLEAN NOT NULL DEFAULT false,
        stage_output JSONB,
        result JSONB,
        error JSONB,
        timing JSONB NOT NULL DEFAULT '{}',
        created DOUBLE PRECISION NOT NULL,
        updated DOUBLE PRECISION NOT NULL,
        finished DOUBLE PRECISION,
        done_seq BIGINT UNIQUE
    );
    CREATE INDEX jobs_waiting ON jobs (stage, priority DESC, seq) WHERE stage <> 'done';
    CREATE INDEX jobs_group ON jobs (group_id) WHERE group_id IS NOT NULL;
    CREATE INDEX jobs_held ON jobs (lease_owner) WHERE lease_owner IS NOT NULL;
    CREATE INDEX jobs_pinned ON jobs (node) WHERE node IS NOT NULL;
    CREATE INDEX jobs_cancelling ON jobs (seq) WHERE cancel_requested AND stage <> 'done';
    CREATE INDEX jobs_finished ON jobs (finished) WHERE stage = 'done';
    CREATE SEQUENCE jobs_done_seq;
    CREATE TABLE backends (
        backend_id TEXT PRIMARY KEY,
        spec JSONB NOT NULL,
        updated DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE nodes (
        owner TEXT PRIMARY KEY,
        node_id TEXT NOT NULL,
        info JSONB NOT NULL DEFAULT '{}',
        started DOUBLE PRECISION NOT NULL,
        seen DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION NOT NULL
    );
    """,
    # 2: a retry's backoff parks the job in the store instead of holding a worker.
    """
    ALTER TABLE jobs ADD COLUMN not_before DOUBLE PRECISION;
    """,
    # 3: a model's pause holds its calls on every node.
    """
    CREATE TABLE pauses (
        model TEXT PRIMARY KEY,
        pause JSONB NOT NULL,
        updated DOUBLE PRECISION NOT NULL
    );
    """,
    # 4: what the web viewer filters and sorts jobs on, kept by the database from the JSON;
    # the events a running episode appends turn by turn.
    """
    ALTER TABLE jobs
        ADD COLUMN kind TEXT GENERATED ALWAYS AS (request #>> '{task,kind}') STORED,
        ADD COLUMN task_id TEXT GENERATED ALWAYS AS (request #>> '{task,task_id}') STORED,
        ADD COLUMN model TEXT GENERATED ALWAYS AS (request ->> 'model') STORED,
        ADD COLUMN reward DOUBLE PRECISION
            GENERATED ALWAYS AS ((result ->> 'reward')::double precision) STORED,
        ADD COLUMN exit_reason TEXT GENERATED ALWAYS AS (result ->> 'exit_reason') STORED,
        ADD COLUMN policy_version BIGINT
            GENERATED ALWAYS AS ((result ->> 'max_policy_version')::bigint) STORED,
        ADD COLUMN turns INTEGER GENERATED ALWAYS AS ((result ->> 'turns')::integer) STORED,
        ADD COLUMN error_code TEXT GENERATED ALWAYS AS (error ->> 'code') STORED;
    CREATE INDEX jobs_created ON jobs (created);
    CREATE INDEX jobs_status ON jobs (status, created);
    CREATE INDEX jobs_kind ON jobs (kind, created);
    CREATE INDEX jobs_reward ON jobs (reward);
    CREATE INDEX jobs_exit ON jobs (exit_reason, created);
    CREATE INDEX jobs_version ON jobs (policy_version);
    CREATE INDEX jobs_finished_all ON jobs (finished);
    CREATE TABLE job_events (
        seq BIGSERIAL PRIMARY KEY,
        job_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        turn INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        data JSONB NOT NULL
    );
    CREATE INDEX job_events_job ON job_events (job_id, seq);
    """,
]
VERSION = len(MIGRATIONS)


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the database to this code's schema; returns the version it is at."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        cur.execute("CREATE TABLE IF NOT EXISTS rollserve_schema (version INTEGER NOT NULL)")
        row = cur.execute("SELECT max(version) FROM rollserve_schema").fetchone()
        found = int(row[0]) if row and row[0] is not None else 0
        if found > VERSION:
            raise StoreSchemaError(
                f"the PostgreSQL store has schema version {found}; this rollserve knows up to "
                f"{VERSION}: upgrade rollserve",
                found=found,
                known=VERSION,
            )
        for version in range(found + 1, VERSION + 1):
            cur.execute(MIGRATIONS[version - 1].encode())
            cur.execute("INSERT INTO rollserve_schema (version) VALUES (%s)", (version,))
    return VERSION
