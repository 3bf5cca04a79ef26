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

if TYPE_CHECKING:
    from rollserve.fixtures.postgres import TempPostgres

# The longest files, longest first (measured by ``make test``'s --durations). The workers take
# a file at a time in the order collected: these start first, so that no worker is left with
# one of them at the end while the others idle.
LONGEST_FILES = (
    "tests/integration/test_gateway_agents.py",
    "tests/swebench/test_instances.py",
    "tests/bench/test_bench_learn.py",
    "tests/integration/test_weight_update.py",
    "tests/integration/test_train_trl.py",
    "tests/integration/test_verl.py",
    "tests/bench/test_bench_images.py",
    "tests/integration/test_fleet.py",
    "tests/integration/test_rollouts.py",
    "tests/bench/test_bench.py",
    "tests/integration/test_token_fidelity.py",
    "tests/swebench/test_restart.py",
    "tests/cli/test_demo.py",
    "tests/swebench/test_harness_agents.py",
    "tests/integration/test_api_fuzz.py",
    "tests/integration/test_slime.py",
    "tests/harbor/test_harbor.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, each file's tests in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    root = Path(__file__).parent.parent

    def key(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(root).as_posix(), len(rank))

    items.sort(key=key)


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
