"""The job store on SQLite (WAL): one file, safe for several threads and processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rollserve.storage.sql.store import SqlJobStore
from rollserve.storage.sqlite.dialect import SqliteDialect
from rollserve.storage.sqlite.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "SqliteJobStore"]


class SqliteJobStore(SqlJobStore):
    """:class:`rollserve.storage.base.Store` in one SQLite file."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.dialect = SqliteDialect(path, clock=clock)
        super().__init__(self.dialect)
        self.path = path
