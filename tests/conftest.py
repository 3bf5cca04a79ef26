"""Fixtures shared by every test: a private data directory and a sandbox manager over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings


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
    from rollserve.testing.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.getbasetemp() / "models")


from tests.swe_tasks import prepared  # noqa: E402, F401  (the session fixture, registered once)
