"""What several commands share: the data directory option, the settings it gives, and a
sandbox manager for the length of one piece of work."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="state directory")]


def settings_for(data_dir: Path | None) -> Settings:
    """The settings, with ``--data-dir`` where it was given."""
    return Settings(data_dir=data_dir) if data_dir else Settings()


async def with_manager(settings: Settings, work):  # type: ignore[no-untyped-def]
    """``work(manager)`` with a sandbox manager that closes every sandbox after it."""
    async with SandboxManager(settings) as manager:
        return await work(manager)
