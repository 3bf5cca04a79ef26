"""Every job store, behind one fixture: the conformance suite runs each test over each of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollserve.storage.base import Store
from rollserve.storage.postgres import PostgresJobStore
from rollserve.storage.sqlite import SqliteJobStore


class Clock:
    """A clock the test moves by hand, so leases expire without waiting."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class StoreKit:
    """Opens connections to one database of one kind of store (each ``open`` is another
    connection, as another process or node would have); closes them all at the end."""

    def __init__(self, kind: str, opener: Callable[[Callable[[], float] | None], Store]) -> None:
        self.kind = kind
        self.clock = Clock()
        self._opener = opener
        self._opened: list[Store] = []

    def open(self, *, own_clock: bool = True) -> Store:
        """A connection to the database; ``own_clock`` False: the store's real time."""
        store = self._opener(self.clock if own_clock else None)
        self._opened.append(store)
        return store

    def close(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKit]:
    if request.param == "sqlite":
        path = tmp_path / "jobs.db"
        made = StoreKit("sqlite", lambda clock: SqliteJobStore(path, **_clocked(clock)))
    else:
        url = request.getfixturevalue("pg_url")
        made = StoreKit("postgres", lambda clock: PostgresJobStore(url, pool_size=4, clock=clock))
    yield made
    made.close()


def _clocked(clock: Callable[[], float] | None) -> dict[str, Callable[[], float]]:
    return {} if clock is None else {"clock": clock}


@pytest.fixture
def clock(kit: StoreKit) -> Clock:
    return kit.clock


@pytest.fixture
def store(kit: StoreKit) -> Store:
    return kit.open()
