"""The PostgreSQL store's connections: a pool of autocommit connections for the store's
statements and transactions, the database's clock, NOTIFY, the results feed's ordering lock,
a listening connection of its own for the announcements of every node; and what is not about
jobs: the nodes' rows, the inference backends and the models' pauses."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from rollserve.errors import StoreUnavailableError
from rollserve.storage.base import NodeRecord
from rollserve.storage.pg_schema import CHANNEL, FEED_LOCK, migrate

log = logging.getLogger(__name__)

Cursor = psycopg.Cursor[dict[str, Any]]


class PgConnection:
    """What every PostgreSQL store operation stands on."""

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

    def _one(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """One statement, its own transaction: the hot paths are one round trip each. ``now``
        is ``params["now"]``, or the database's clock (``_T``)."""
        try:
            with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                cur.execute(
                    query.encode(), {"now": self._clock() if self._clock else None, **params}
                )
                return cur.fetchall() if cur.description else []
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailableError(f"the PostgreSQL store does not answer: {exc}") from exc

    @contextmanager
    def _tx(self) -> Iterator[Cursor]:
        """One transaction; an unreachable database is a StoreUnavailableError."""
        try:
            with (
                self._pool.connection() as conn,
                conn.transaction(),
                conn.cursor(row_factory=dict_row) as cur,
            ):
                yield cur
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailableError(f"the PostgreSQL store does not answer: {exc}") from exc

    def _now(self, cur: Cursor) -> float:
        if self._clock is not None:
            return self._clock()
        cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now")
        return float(first(cur)["now"])

    @staticmethod
    def _notify(cur: Cursor, event: str) -> None:
        cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, event))

    @staticmethod
    def _feed_place(cur: Cursor) -> int:
        """The next place in the results feed. The lock, taken first, is held to the commit:
        places become visible in their order, so a reader that has seen N has seen everything
        before N."""
        cur.execute(
            "SELECT nextval('jobs_done_seq') AS seq FROM (SELECT pg_advisory_xact_lock(%s)) AS l",
            (FEED_LOCK,),
        )
        return int(first(cur)["seq"])

    def subscribe(self, on_event: Callable[[str], None]) -> Callable[[], None]:
        stop = threading.Event()
        thread = threading.Thread(
            target=self._listen, args=(on_event, stop), name="rollserve-store-listen", daemon=True
        )
        thread.start()

        def unsubscribe() -> None:
            stop.set()
            thread.join()

        return unsubscribe

    def _listen(self, on_event: Callable[[str], None], stop: threading.Event) -> None:
        """LISTEN on a connection of its own; after a reconnect, ``*``: events may be lost."""
        while not stop.is_set():
            try:
                with psycopg.connect(self._conninfo, **self._kwargs) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    on_event("*")
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            on_event(note.payload)
            except psycopg.OperationalError as exc:
                log.warning("store notifications lost (%s); reconnecting", exc)
                stop.wait(1.0)

    # -- the fleet's nodes, inference backends and pauses -----------------------------------

    def nodes(self) -> list[NodeRecord]:
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute("SELECT * FROM nodes ORDER BY started, owner")
            rows = cur.fetchall()
        return [
            NodeRecord(
                owner=row["owner"],
                node_id=row["node_id"],
                info=row["info"],
                started=row["started"],
                seen=row["seen"],
                alive=row["expires"] >= now,
            )
            for row in rows
        ]

    def save_backend(self, backend_id: str, spec: dict[str, Any]) -> None:
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute(
                "INSERT INTO backends (backend_id, spec, updated) VALUES (%s, %s, %s)"
                " ON CONFLICT (backend_id) DO UPDATE SET spec = excluded.spec,"
                " updated = excluded.updated",
                (backend_id, Jsonb(spec), now),
            )
            self._notify(cur, "backends")

    def save_pause(self, model: str, pause: dict[str, Any] | None) -> None:
        with self._tx() as cur:
            if pause is None:
                cur.execute("DELETE FROM pauses WHERE model = %s", (model,))
            else:
                cur.execute(
                    "INSERT INTO pauses (model, pause, updated) VALUES (%s, %s, %s)"
                    " ON CONFLICT (model) DO UPDATE SET pause = excluded.pause,"
                    " updated = excluded.updated",
                    (model, Jsonb(pause), self._now(cur)),
                )
            self._notify(cur, "backends")

    def load_pauses(self) -> dict[str, dict[str, Any]]:
        rows = self._one("SELECT model, pause FROM pauses", {})
        return {row["model"]: row["pause"] for row in rows}

    def load_backends(self) -> list[dict[str, Any]]:
        with self._tx() as cur:
            cur.execute("SELECT spec FROM backends ORDER BY updated, backend_id")
            return [row["spec"] for row in cur.fetchall()]

    def delete_backend(self, backend_id: str) -> bool:
        with self._tx() as cur:
            cur.execute("DELETE FROM backends WHERE backend_id = %s", (backend_id,))
            deleted = cur.rowcount > 0
            self._notify(cur, "backends")
            return deleted

    def close(self) -> None:
        self._pool.close()


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Every statement of the store finds its rows through an index. Prepared statements keep
    the plan made when the jobs table was small, where a sequential scan was cheapest; as the
    table grows that plan would read every job on every heartbeat and submit. The store's
    statements are short: compiling one (JIT, which the cost of a scan without an index
    would set off) takes longer than running it many times."""
    conn.execute("SET enable_seqscan = off")
    conn.execute("SET jit = off")


def first(cur: Cursor) -> dict[str, Any]:
    row = cur.fetchone()
    assert row is not None
    return row


def json_or_none(value: dict[str, Any] | None) -> Jsonb | None:
    return None if value is None else Jsonb(value)
