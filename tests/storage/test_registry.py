"""``store_url`` picks the job store by URL scheme: SQLite by default under the data
directory, or at the path a ``sqlite://`` URL names, PostgreSQL for ``postgresql://``; a URL
that names no store is refused with a message that names it and the known schemes; a
password comes from a file or the environment and is never repeated."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rollserve.errors import InvalidInputError, StoreUnavailableError
from rollserve.fixtures.postgres import TempPostgres
from rollserve.settings import Settings
from rollserve.storage import NewJob, SqliteJobStore
from rollserve.storage.postgres import PostgresJobStore
from rollserve.storage.registry import default_stores, open_store, redacted


def test_the_default_is_sqlite_under_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    assert settings.store_location == f"sqlite://{tmp_path / 'data' / 'jobs.db'}"
    store = open_store(settings)
    try:
        assert isinstance(store, SqliteJobStore) and store.path == tmp_path / "data" / "jobs.db"
    finally:
        store.close()


def test_a_sqlite_url_names_the_file(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'elsewhere' / 'fleet.db'}"
    store = open_store(Settings(data_dir=tmp_path / "data", store_url=url))
    try:
        store.submit([NewJob("j", {"task": {}})], max_queued=10)
    finally:
        store.close()
    assert (tmp_path / "elsewhere" / "fleet.db").is_file()
    assert not (tmp_path / "data" / "jobs.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://db/rollserve", "unknown job store 'mysql'; known: postgres, postgresql, sqlite"),
        ("jobs.db", "is not a URL"),
        ("sqlite://", "names no file"),
        ("sqlite:///proc/no/such/dir/jobs.db", "cannot open the SQLite file"),
    ],
)
def test_a_url_that_names_no_store_is_refused(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as refused:
        open_store(Settings(data_dir=tmp_path, store_url=url))
    assert refused.value.details["field"] == "store_url"
    assert url in refused.value.message  # (no password in it to hide)


def test_stores_register_by_scheme() -> None:
    assert sorted(default_stores().names()) == ["postgres", "postgresql", "sqlite"]


def test_a_postgresql_url_opens_the_shared_store(tmp_path: Path, pg_url: str) -> None:
    store = open_store(Settings(data_dir=tmp_path, store_url=pg_url))
    try:
        assert isinstance(store, PostgresJobStore)
        store.submit([NewJob("j", {"task": {}})], max_queued=10)
    finally:
        store.close()
    assert not (tmp_path / "jobs.db").exists()


def test_the_password_comes_from_a_file_and_is_never_shown(
    tmp_path: Path, postgres: TempPostgres
) -> None:
    url = postgres.create(f"pw{uuid.uuid4().hex[:8]}")
    user = f"u{uuid.uuid4().hex[:8]}"
    postgres.password_user(user, "s3cret-Pw")
    url = url.replace("postgres@", f"{user}@")
    secret = tmp_path / "password"
    secret.write_text("s3cret-Pw\n")
    store = open_store(Settings(data_dir=tmp_path, store_url=url, store_password_file=secret))
    store.close()
    secret.write_text("wrong-Pw")
    with pytest.raises(StoreUnavailableError) as refused:
        open_store(Settings(data_dir=tmp_path, store_url=url, store_password_file=secret))
    assert "password authentication failed" in refused.value.message
    assert "wrong-Pw" not in refused.value.message
    with pytest.raises(InvalidInputError, match="store_password_file: cannot read"):
        open_store(
            Settings(data_dir=tmp_path, store_url=url, store_password_file=tmp_path / "none")
        )


def test_a_password_in_the_url_is_not_repeated_in_errors() -> None:
    assert redacted("postgresql://me:hunter2@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redacted("postgresql://me@db/x") == "postgresql://me@db/x"
    with pytest.raises(InvalidInputError) as refused:
        open_store(Settings(store_url="mysql://me:hunter2@db/x"))
    assert "hunter2" not in refused.value.message
