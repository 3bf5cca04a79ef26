"""``store_url`` picks the job store by URL scheme: SQLite by default under the data
directory, or at the path a ``sqlite://`` URL names; a URL that names no store is refused with
a message that names it and the known schemes."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.errors import InvalidInputError
from rollserve.settings import Settings
from rollserve.storage import NewJob, SqliteJobStore
from rollserve.storage.registry import default_stores, open_store


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
        ("mysql://db/rollserve", "unknown job store 'mysql'; known: sqlite"),
        ("jobs.db", "is not a URL"),
        ("sqlite://", "names no file"),
        ("sqlite:///proc/no/such/dir/jobs.db", "cannot open the SQLite file"),
    ],
)
def test_a_url_that_names_no_store_is_refused(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as refused:
        open_store(Settings(data_dir=tmp_path, store_url=url))
    assert refused.value.details["field"] == "store_url"
    assert url in refused.value.message


def test_stores_register_by_scheme() -> None:
    assert default_stores().names() == ["sqlite"]
