"""Job stores by URL scheme: ``store_url`` picks the store (``sqlite://PATH`` today)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rollserve.errors import InvalidInputError, UnknownNameError
from rollserve.registry import Registry
from rollserve.settings import Settings
from rollserve.storage.base import Store
from rollserve.storage.sqlite import SqliteJobStore

StoreFactory = Callable[[str, Settings], Store]
"""Opens the store at a URL of its scheme."""


def default_stores() -> Registry[StoreFactory]:
    """The stores rollserve ships, by URL scheme."""
    stores: Registry[StoreFactory] = Registry("job store")
    stores.register("sqlite", _sqlite)
    return stores


def open_store(settings: Settings, stores: Registry[StoreFactory] | None = None) -> Store:
    """The store ``settings.store_location`` names; a URL that names none is an error that
    says which schemes are known."""
    url = settings.store_location
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise InvalidInputError(
            f"store_url {url!r} is not a URL: give SCHEME://… (e.g. sqlite:///var/rollserve/jobs.db)",
            field="store_url",
        )
    try:
        factory = (stores or default_stores()).get(scheme)
    except UnknownNameError as exc:
        raise InvalidInputError(f"store_url {url!r}: {exc.message}", field="store_url") from exc
    return factory(url, settings)


def _sqlite(url: str, settings: Settings) -> Store:
    """``sqlite://PATH``: everything after the scheme is the file's path (``sqlite:///a/b.db``
    is ``/a/b.db``; a relative path is taken from the working directory)."""
    path = url.removeprefix("sqlite://")
    if not path:
        raise InvalidInputError("store_url sqlite:// names no file", field="store_url")
    try:
        return SqliteJobStore(Path(path))
    except OSError as exc:
        raise InvalidInputError(
            f"store_url {url!r}: cannot open the SQLite file: {exc}", field="store_url"
        ) from exc
