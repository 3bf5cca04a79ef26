"""Job stores by URL scheme: ``store_url`` picks the store (``sqlite://PATH``,
``postgresql://…``)."""

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
    stores.register("postgresql", _postgres)
    stores.register("postgres", _postgres)
    return stores


def open_store(settings: Settings, stores: Registry[StoreFactory] | None = None) -> Store:
    """The store ``settings.store_location`` names; a URL that names none is an error that
    says which schemes are known."""
    url = settings.store_location
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise InvalidInputError(
            f"store_url {redacted(url)!r} is not a URL: give SCHEME://… (e.g. sqlite:///var/rollserve/jobs.db)",
            field="store_url",
        )
    try:
        factory = (stores or default_stores()).get(scheme)
    except UnknownNameError as exc:
        raise InvalidInputError(
            f"store_url {redacted(url)!r}: {exc.message}", field="store_url"
        ) from exc
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


def _postgres(url: str, settings: Settings) -> Store:
    """``postgresql://USER@HOST:PORT/DB?…`` (libpq's URL; its environment variables such as
    ``PGPASSWORD`` apply too). The password may come from ``store_password`` or
    ``store_password_file`` instead of the URL, so that it is never in a command line."""
    from rollserve.storage.postgres import PostgresJobStore  # psycopg only where it is used

    password = settings.store_password.get_secret_value() if settings.store_password else None
    if settings.store_password_file is not None:
        try:
            password = settings.store_password_file.read_text().strip()
        except OSError as exc:
            raise InvalidInputError(
                f"store_password_file: cannot read {settings.store_password_file}: {exc.strerror}",
                field="store_password_file",
            ) from exc
    return PostgresJobStore(url, password=password, pool_size=settings.store_pool_size)


def redacted(url: str) -> str:
    """The store URL as it may be logged: without a password."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
