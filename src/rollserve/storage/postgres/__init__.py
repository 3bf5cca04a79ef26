"""The job store on PostgreSQL: the shared state of a fleet of nodes.

Workers claim with ``FOR UPDATE SKIP LOCKED``; time is the database's; the results feed's
cursor is a sequence drawn under a transaction lock, so places in the feed are committed in
their order and a reader never passes one that is still to appear. Changes are announced with
``NOTIFY`` so that long-polls and idle workers on every node wake at once.
"""

from __future__ import annotations

from collections.abc import Callable

from rollserve.storage.postgres.dialect import PostgresDialect
from rollserve.storage.sql.store import SqlJobStore

__all__ = ["PostgresJobStore"]


class PostgresJobStore(SqlJobStore):
    """:class:`rollserve.storage.base.Store` on a PostgreSQL database shared by nodes."""

    def __init__(
        self,
        conninfo: str,
        *,
        password: str | None = None,
        pool_size: int = 10,
        clock: Callable[[], float] | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.dialect = PostgresDialect(
            conninfo,
            password=password,
            pool_size=pool_size,
            clock=clock,
            connect_timeout_s=connect_timeout_s,
        )
        super().__init__(self.dialect)
