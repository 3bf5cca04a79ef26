"""What a SQL database gives the job store (:class:`rollserve.storage.sql.store.SqlJobStore`): its
connection and transactions, the store's clock, and the few pieces of SQL that its flavour
writes its own way.

The store writes its statements once, with parameters named ``:name``. ``:now`` is the store's
time, never a node's: on SQLite the clock read once the write lock is held, on PostgreSQL the
database's (the caller's clock instead, where a test gives one); it is the same for every
statement of one transaction. SQL literals in a statement hold no ``:word``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from rollserve.storage.base import StoreEvent

Row = dict[str, Any]
"""A row by column name, its JSON columns decoded."""
Params = Mapping[str, Any]
NO_PARAMS: Params = {}
ColumnType = Literal["text", "integer", "json"]


class Tx(Protocol):
    """One write transaction: it commits when the ``with`` block ends, and rolls back when the
    block raises."""

    @property
    def now(self) -> float:
        """The transaction's time (what ``:now`` is in its statements)."""
        ...

    def query(self, sql: str, params: Params = NO_PARAMS) -> list[Row]:
        """Run a statement; its rows (none for a statement that returns none)."""
        ...

    def execute(self, sql: str, params: Params = NO_PARAMS) -> int:
        """Run a statement; how many rows it changed."""
        ...


class Dialect(Protocol):
    """One database the store runs on: how it is reached, and its SQL where it differs."""

    for_update: str
    """The clause that locks the rows a transaction reads to change them ("" where writers are
    serialised anyway)."""
    skip_locked: str
    """The clause that locks them and passes over rows another transaction holds: two claims
    never wait on each other, nor take the same job."""
    feed_place: str
    """An expression: the next place in the results feed (one row's, per statement). Places
    become visible in their order: a reader that has seen N has seen every place before N."""

    def among(self, column: str, name: str) -> str:
        """SQL: ``column`` is one of the values of the list parameter ``name``."""
        ...

    def listed(self, values: Sequence[Any]) -> Any:
        """A list as the value of a parameter for :meth:`among`."""
        ...

    def records(self, name: str, columns: Sequence[tuple[str, ColumnType]]) -> str:
        """A relation ``n`` of the objects in the JSON list parameter ``name``: ``columns``,
        taken from their keys, and ``ord``, each object's place in the list."""
        ...

    def json(self, value: Any) -> Any:
        """A JSON value as the value of a parameter."""
        ...

    def merged(self, column: str, name: str) -> str:
        """SQL: the JSON object in ``column`` with the keys of the JSON object parameter
        ``name`` set (values that are not objects: they replace those of the same key)."""
        ...

    def announce(self, event: StoreEvent) -> str:
        """An expression for a RETURNING list: tell every node's :meth:`subscribe` of
        ``event`` (a word), once the change commits; NULL where nodes cannot be told."""
        ...

    def read(self, sql: str, params: Params = NO_PARAMS) -> list[Row]:
        """Run a statement that changes nothing; its rows."""
        ...

    def write(
        self, sql: str, params: Params = NO_PARAMS, *, after: Sequence[str] = ()
    ) -> list[Row]:
        """Run a statement, then each of ``after``, in one transaction (one round trip where
        the database can); the statement's rows. The ``after`` statements change other tables
        than the first and read nothing it changed, but may read the relation
        ``returned(job_id)``: the job ids it returned."""
        ...

    def transaction(self) -> AbstractContextManager[Tx]:
        """A write transaction, for what needs rows read under a lock before it decides."""
        ...

    def results_head(self) -> int:
        """The latest place in the results feed that every reader may see (0 before any)."""
        ...

    def subscribe(self, on_event: Callable[[StoreEvent], None]) -> Callable[[], None]:
        """See :meth:`rollserve.storage.base.JobStore.subscribe`."""
        ...

    def close(self) -> None: ...
