"""Fixtures shared by every test: a private data directory and a sandbox manager over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
async def manager(settings: Settings) -> AsyncIterator[SandboxManager]:
    async with SandboxManager(settings) as mgr:
        yield mgr
