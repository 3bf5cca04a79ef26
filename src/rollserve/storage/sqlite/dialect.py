"""The job store's SQLite (WAL) file: one connection serialised by a lock, write transactions
taken at once, the caller's clock read once the file is ours, JSON kept as text."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollserve.errors import StoreUnavailableError
from rollserve.storage.base import StoreEvent
from rollserve.storage.sql.dialect import NO_PARAMS, ColumnType, Params, Row
from rollserve.storage.sqlite.schema import FEED_PLACE, migrate

# SQLite's result codes of a file that cannot be used for now (another process holds it, its
# disk is full, the disk fails): the store does not answer, and callers try again later.
_PASSING = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")
# The columns that hold JSON text, decoded in every row read.
_JSON_COLUMNS = frozenset(
    ("request", "stage_output", "result", "error", "timing", "info", "spec", "pause", "data")
)
_RETURNED = "WITH returned(job_id) AS (SELECT value FROM json_each(:returned)) "


class SqliteDialect:
    """:class:`rollserve.storage.sql.dialect.Dialect` on one SQLite file, safe for several threads
    and processes."""

    for_update = ""  # a write transaction holds the whole file
    skip_locked = ""
    feed_place = FEED_PLACE

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        migrate(self._db, path)
        self._db.row_factory = _row

    # -- SQL ---------------------------------------------------------------------------------------

    def among(self, column: str, name: str) -> str:
        return f"{column} IN (SELECT value FROM json_each(:{name}))"

    def listed(self, values: Sequence[Any]) -> str:
        return json.dumps(list(values))

    def records(self, name: str, columns: Sequence[tuple[str, ColumnType]]) -> str:
        fields = ", ".join(
            f"CAST(json_extract(value, '$.{column}') AS INTEGER) AS {column}"
            if kind == "integer"
            else f"json_extract(value, '$.{column}') AS {column}"  # an object comes as its text
            for column, kind in columns
        )
        return f"(SELECT {fields}, key AS ord FROM json_each(:{name})) AS n"

    def json(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value)

    def merged(self, column: str, name: str) -> str:
        return f"json_patch({column}, :{name})"

    def announce(self, event: StoreEvent) -> str:
        return "NULL"  # other processes on the file poll

    # -- statements --------------------------------------------------------------------------------

    def read(self, sql: str, params: Params = NO_PARAMS) -> list[Row]:
        with self._lock, self._answering():
            return self._db.execute(sql, {**params, "now": self._clock()}).fetchall()

    def write(
        self, sql: str, params: Params = NO_PARAMS, *, after: Sequence[str] = ()
    ) -> list[Row]:
        with self.transaction() as tx:
            rows = tx.query(sql, params)
            for statement in after:
                if "returned" in statement:
                    ids = json.dumps([row["job_id"] for row in rows])
                    tx.query(_RETURNED + statement, {**params, "returned": ids})
                else:
                    tx.query(statement, params)
        return rows

    @contextmanager
    def transaction(self) -> Iterator[SqliteTx]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): claims never interleave,
        whichever process holds the file. A file that cannot be written now (locked past the
        busy timeout, its disk full) is StoreUnavailableError, and nothing of it is kept."""
        with self._lock, self._answering():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # The time once the file is ours: a wait for another process's lock must not
                # leave a lease or a node row written already stale.
                yield SqliteTx(self._db, self._clock())
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # a failed COMMIT may leave it open
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def results_head(self) -> int:
        rows = self.read("SELECT value FROM counters WHERE name = 'done_seq'")
        return int(rows[0]["value"])

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

    def subscribe(self, on_event: Callable[[StoreEvent], None]) -> Callable[[], None]:
        """SQLite cannot tell other processes' changes: nodes on one file poll."""
        return lambda: None

    def close(self) -> None:
        with self._lock:
            self._db.close()


class SqliteTx:
    """:class:`rollserve.storage.sql.dialect.Tx` in the SQLite file's write transaction."""

    def __init__(self, db: sqlite3.Connection, now: float) -> None:
        self._db = db
        self.now = now

    def query(self, sql: str, params: Params = NO_PARAMS) -> list[Row]:
        return self._db.execute(sql, {**params, "now": self.now}).fetchall()

    def execute(self, sql: str, params: Params = NO_PARAMS) -> int:
        return self._db.execute(sql, {**params, "now": self.now}).rowcount


def _row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> Row:
    """A row by column name, its JSON text decoded."""
    row = {column[0]: value for column, value in zip(cursor.description, values, strict=True)}
    for key in _JSON_COLUMNS.intersection(row):
        if row[key] is not None:
            row[key] = json.loads(row[key])
    return row
