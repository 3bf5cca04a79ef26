"""Fixtures shared by every test: a private data directory, a sandbox manager over it, the
tiny model, a PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings
from tests.missing import missing

pytest_plugins = ["tests.cputime"]  # --cpu-log DIR: each test's CPU time

if TYPE_CHECKING:
    from rollserve.fixtures.postgres import TempPostgres


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", image_cache_dir=tmp_path / "image-cache")


@pytest.fixture
async def manager(settings: Settings) -> AsyncIterator[SandboxManager]:
    async with SandboxManager(settings) as mgr:
        yield mgr


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and its tokenizer (``rollserve.testing``), built once per session."""
    from rollserve.llm.local.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.getbasetemp() / "models")


from tests.swe_tasks import prepared  # noqa: E402, F401  (the session fixture, registered once)


@pytest.fixture(scope="session")
def postgres() -> Iterator[TempPostgres]:
    """One throwaway PostgreSQL server for the session; each test makes its own database.
    Missing PostgreSQL skips the test here, and fails it in CI."""
    from rollserve.fixtures.postgres import TempPostgres, postgres_bin

    if postgres_bin() is None:
        message = "PostgreSQL is not installed (make setup installs it)"
        missing(message)
    server = TempPostgres().start()  # not under basetemp: the postgres user cannot enter it
    yield server
    server.close()


@pytest.fixture
def pg_url(postgres: TempPostgres) -> str:
    """A new empty database on the session's PostgreSQL server."""
    return postgres.create(f"t{uuid.uuid4().hex[:12]}")
