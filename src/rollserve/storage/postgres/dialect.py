"""The job store's PostgreSQL database, shared by the nodes of a fleet: a pool of autocommit
connections, the database's clock, JSONB, arrays, row locks that claims pass over, NOTIFY, and
a listening connection of its own for the announcements of every node."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import dict_row
from psycopg.sql import SQL, Identifier
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from rollserve.errors import StoreUnavailableError
from rollserve.storage.base import StoreEvent
from rollserve.storage.postgres.schema import CHANNEL, FEED_LOCK, migrate
from rollserve.storage.sql.dialect import NO_PARAMS, ColumnType, Params, Row

log = logging.getLogger(__name__)

Cursor = psycopg.Cursor[dict[str, Any]]

_NAMED = re.compile(r"(?<![:\w]):(\w+)")
# ``:now``: the caller's clock when it gives one, else the database's; the transaction's
# start, the same for each of its statements.
_NOW = "coalesce(%(now)s::float8, extract(epoch FROM transaction_timestamp())::float8)"
_TUPLES_OK = ExecStatus.TUPLES_OK
# The settings of the store's sessions (see _configure).
SESSION_SETTINGS = {"enable_seqscan": "off", "jit": "off", "plan_cache_mode": "force_generic_plan"}
_CASTS: dict[ColumnType, str] = {"text": "", "integer": "::integer", "json": ""}


class PostgresDialect:
    """:class:`rollserve.storage.sql.dialect.Dialect` on a PostgreSQL database."""

    for_update = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    # The lock, taken first, is held to the commit: places become visible in their order.
    feed_place = (
        f"(SELECT nextval('jobs_done_seq') FROM (SELECT pg_advisory_xact_lock({FEED_LOCK})) AS l)"
    )

    def __init__(
        self,
        conninfo: str,
        *,
        password: str | None = None,
        pool_size: int = 10,
        clock: Callable[[], float] | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._kwargs: dict[str, Any] = {"row_factory": dict_row, "autocommit": True}
        if password is not None:
            self._kwargs["password"] = password
        self._clock = clock  # None: the database's clock (a test may move its own)
        self._statements: dict[str, bytes] = {}
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_size,
            kwargs=self._kwargs,
            configure=_configure,
            timeout=connect_timeout_s,
            open=False,
            name="rollserve-store",
        )
        try:
            # One connection first: a refusal (a wrong password, no such database) is reported
            # as the server said it, not as a pool that timed out retrying.
            with psycopg.connect(
                conninfo, connect_timeout=max(1, int(connect_timeout_s)), **self._kwargs
            ) as conn:
                migrate(conn)
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            self._pool.close()
            said = " ".join(str(exc).split())  # libpq's message spans lines
            raise StoreUnavailableError(f"cannot reach the PostgreSQL store: {said}") from exc
        except BaseException:
            self._pool.close()
            raise

    # -- SQL ---------------------------------------------------------------------------------------

    def among(self, column: str, name: str) -> str:
        return f"{column} = ANY(:{name})"

    def listed(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def records(self, name: str, columns: Sequence[tuple[str, ColumnType]]) -> str:
        fields = ", ".join(
            f"e.value -> '{column}' AS {column}"
            if kind == "json"
            else f"(e.value ->> '{column}'){_CASTS[kind]} AS {column}"
            for column, kind in columns
        )
        return (
            f"(SELECT {fields}, e.ord FROM jsonb_array_elements(:{name}::jsonb)"
            " WITH ORDINALITY AS e(value, ord)) AS n"
        )

    def json(self, value: Any) -> Jsonb | None:
        return None if value is None else Jsonb(value)

    def merged(self, column: str, name: str) -> str:
        return f"{column} || :{name}"

    def announce(self, event: StoreEvent) -> str:
        # Sent on commit, once per transaction however many rows return it.
        return f"pg_notify('{CHANNEL}', '{event.value}')"

    def statement(self, text: str) -> bytes:
        """The store's statement in psycopg's placeholders (``:name`` as ``%(name)s``)."""
        done = self._statements.get(text)
        if done is None:
            done = _NAMED.sub(_placeholder, text.replace("%", "%%")).encode()
            self._statements[text] = done
        return done

    # -- statements --------------------------------------------------------------------------------

    def read(self, sql: str, params: Params = NO_PARAMS) -> list[Row]:
        return self._one(sql, params)

    def write(
        self, sql: str, params: Params = NO_PARAMS, *, after: Sequence[str] = ()
    ) -> list[Row]:
        if after:  # one statement still: the others as data-modifying CTEs
            also = "".join(f", after_{i} AS ({text})" for i, text in enumerate(after))
            sql = f"WITH returned AS ({sql}){also} SELECT * FROM returned"
        return self._one(sql, params)

    def _one(self, sql: str, params: Params) -> list[Row]:
        """One statement, its own transaction: one round trip."""
        with (
            self._answering(),
            self.connection() as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            cur.execute(self.statement(sql), {**params, "now": self._now()})
            return _rows(cur)

    @contextmanager
    def transaction(self) -> Iterator[PgTx]:
        """One transaction; an unreachable database is a StoreUnavailableError."""
        with (
            self._answering(),
            self.connection() as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            yield PgTx(self, cur, self._now())

    def results_head(self) -> int:
        with self.transaction() as tx:
            # Behind every finisher that holds the feed's lock: their places are visible now.
            tx.query(f"SELECT pg_advisory_xact_lock_shared({FEED_LOCK})")
            rows = tx.query(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS head FROM jobs_done_seq"
            )
        return int(rows[0]["head"])

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection of the store's pool, set up as the store's statements need it."""
        return self._pool.connection()

    def _now(self) -> float | None:
        return self._clock() if self._clock is not None else None

    @contextmanager
    def _answering(self) -> Iterator[None]:
        try:
            yield
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailableError(f"the PostgreSQL store does not answer: {exc}") from exc

    # -- announcements -----------------------------------------------------------------------------

    def subscribe(self, on_event: Callable[[StoreEvent], None]) -> Callable[[], None]:
        stop = threading.Event()
        thread = threading.Thread(
            target=self._listen, args=(on_event, stop), name="rollserve-store-listen", daemon=True
        )
        thread.start()

        def unsubscribe() -> None:
            stop.set()
            thread.join()

        return unsubscribe

    def _listen(self, on_event: Callable[[StoreEvent], None], stop: threading.Event) -> None:
        """LISTEN on a connection of its own; after a reconnect, ``*``: events may be lost."""
        while not stop.is_set():
            try:
                with psycopg.connect(self._conninfo, **self._kwargs) as conn:
                    conn.execute(SQL("LISTEN {}").format(Identifier(CHANNEL)))
                    on_event(StoreEvent.ANY)
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            on_event(_event(note.payload))
            except psycopg.OperationalError as exc:
                log.warning("store notifications lost (%s); reconnecting", exc)
                stop.wait(1.0)

    def close(self) -> None:
        self._pool.close()


class PgTx:
    """:class:`rollserve.storage.sql.dialect.Tx` on one connection of the pool."""

    def __init__(self, dialect: PostgresDialect, cur: Cursor, now: float | None) -> None:
        self._dialect = dialect
        self._cur = cur
        self._now = now

    @property
    def now(self) -> float:
        if self._now is None:  # the database's time, asked for once
            self._cur.execute(b"SELECT extract(epoch FROM transaction_timestamp())::float8 AS t")
            row = self._cur.fetchone()
            assert row is not None
            self._now = float(row["t"])
        return self._now

    def query(self, sql: str, params: Params = NO_PARAMS) -> list[Row]:
        self._cur.execute(self._dialect.statement(sql), {**params, "now": self._now})
        return _rows(self._cur)

    def execute(self, sql: str, params: Params = NO_PARAMS) -> int:
        self._cur.execute(self._dialect.statement(sql), {**params, "now": self._now})
        return self._cur.rowcount


def _rows(cur: Cursor) -> list[Row]:
    """The rows of the statement just run; none for one that returns none. (Not through
    ``cur.description``: that builds an object per column, a third of a call's client time.)"""
    result = cur.pgresult
    return cur.fetchall() if result is not None and result.status == _TUPLES_OK else []


def _placeholder(match: re.Match[str]) -> str:
    name = match.group(1)
    return _NOW if name == "now" else f"%({name})s"


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Every statement of the store finds its rows through an index. Prepared statements keep
    the plan made when the jobs table was small, where a sequential scan was cheapest; as the
    table grows that plan would read every job on every heartbeat and submit. The store's
    statements are short: compiling one (JIT, which the cost of a scan without an index
    would set off) takes longer than running it many times, and so does planning it again
    for each call's values, which PostgreSQL would do for some of them by its estimates."""
    for name, value in SESSION_SETTINGS.items():
        conn.execute(SQL("SET {} = {}").format(Identifier(name), Identifier(value)))


def _event(payload: str) -> StoreEvent:
    """A notification's event; one this node does not know (a newer node's) means: look."""
    try:
        return StoreEvent(payload)
    except ValueError:
        return StoreEvent.ANY
