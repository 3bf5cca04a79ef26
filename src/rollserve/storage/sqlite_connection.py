"""The SQLite store's file: its schema (a version in ``PRAGMA user_version``, migrated in
place), one connection serialised by a lock, write transactions taken at once, and what is
not about jobs: the nodes' rows and the inference backends."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollserve.errors import StoreSchemaError, StoreUnavailableError
from rollserve.storage.base import NodeRecord

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
# SQLite's result codes of a file that cannot be used for now (another process holds it, its
# disk is full, the disk fails): the store does not answer, and callers try again later.
_PASSING = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")
SCHEMA_VERSION = 5  # PRAGMA user_version; 1 had no nodes, 2 no not_before, 3 no pauses,
# 4 neither the generated columns nor job_events


class SqliteConnection:
    """What every SQLite store operation stands on."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self._db.close()
            raise StoreSchemaError(
                f"{path} has schema version {version}; this rollserve knows up to "
                f"{SCHEMA_VERSION}: upgrade rollserve",
                found=version,
                known=SCHEMA_VERSION,
            )
        self._migrate()
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _migrate(self) -> None:
        """Create the schema, or bring an older file's to this version: a jobs table without
        the generated columns is rebuilt with them (SQLite adds stored columns no other way)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_xinfo(jobs)")}
        if columns and "not_before" not in columns:  # a file of schema version 1 or 2
            self._db.execute("ALTER TABLE jobs ADD COLUMN not_before REAL")
        if columns and "kind" not in columns:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(_JOBS.format(table="jobs_new", generated=_GENERATED))
            self._db.execute(
                f"INSERT INTO jobs_new ({_STORED_COLUMNS}) SELECT {_STORED_COLUMNS} FROM jobs"
            )
            self._db.execute("DROP TABLE jobs")
            self._db.execute("ALTER TABLE jobs_new RENAME TO jobs")
            self._db.execute("COMMIT")
        self._db.executescript(_JOBS.format(table="jobs", generated=_GENERATED) + _SCHEMA)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): claims never interleave,
        whichever process holds the file. A file that cannot be written now (locked past the
        busy timeout, its disk full) is StoreUnavailableError, and nothing of it is kept."""
        with self._lock, self._answering():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # a failed COMMIT may leave it open
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock, self._answering():
            return self._db.execute(sql, args).fetchall()

    @contextmanager
    def _answering(self) -> Iterator[None]:
        """SQLite's errors of the moment as the store's own: callers wait and try again."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            reason = getattr(exc, "sqlite_errorname", "SQLITE_ERROR")
            if not reason.startswith(_PASSING):  # a mistake in a statement: a bug
                raise
            what = {"SQLITE_FULL": "its disk is full", "SQLITE_BUSY": "it is locked"}.get(
                reason, "it cannot be read or written"
            )
            raise StoreUnavailableError(
                f"the SQLite store {self.path} cannot be used now: {what} ({exc})",
                reason=reason,
            ) from exc

    def nodes(self) -> list[NodeRecord]:
        now = self._clock()
        rows = self._read("SELECT * FROM nodes ORDER BY started, owner")
        return [
            NodeRecord(
                owner=row["owner"],
                node_id=row["node_id"],
                info=json.loads(row["info"]),
                started=row["started"],
                seen=row["seen"],
                alive=row["expires"] >= now,
            )
            for row in rows
        ]

    def subscribe(self, on_event: Callable[[str], None]) -> Callable[[], None]:
        """SQLite cannot tell other processes' changes: nodes on one file poll."""
        return lambda: None

    # -- inference backends ----------------------------------------------------------------------

    def save_backend(self, backend_id: str, spec: dict[str, Any]) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO backends (backend_id, spec, updated) VALUES (?, ?, ?)"
                " ON CONFLICT (backend_id) DO UPDATE SET spec = excluded.spec,"
                " updated = excluded.updated",
                (backend_id, json.dumps(spec), self._clock()),
            )

    def save_pause(self, model: str, pause: dict[str, Any] | None) -> None:
        with self._write() as db:
            if pause is None:
                db.execute("DELETE FROM pauses WHERE model = ?", (model,))
                return
            db.execute(
                "INSERT INTO pauses (model, pause, updated) VALUES (?, ?, ?) ON CONFLICT (model)"
                " DO UPDATE SET pause = excluded.pause, updated = excluded.updated",
                (model, json.dumps(pause), self._clock()),
            )

    def load_pauses(self) -> dict[str, dict[str, Any]]:
        rows = self._read("SELECT model, pause FROM pauses")
        return {row["model"]: json.loads(row["pause"]) for row in rows}

    def load_backends(self) -> list[dict[str, Any]]:
        rows = self._read("SELECT spec FROM backends ORDER BY updated, backend_id")
        return [json.loads(row["spec"]) for row in rows]

    def delete_backend(self, backend_id: str) -> bool:
        with self._write() as db:
            return bool(
                db.execute("DELETE FROM backends WHERE backend_id = ?", (backend_id,)).rowcount
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
