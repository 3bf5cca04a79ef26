"""Layers a run hands to its evaluation: what a sandbox with a writable root wrote anywhere in
its filesystem, kept in the data directory from the run's close until the job ends.

``DATA_DIR/layers/<digest of the job id>/`` holds ``job`` (the job id) and ``layer`` (the
overlay's upper directory). A job that ends drops its own; what a crash or a cancel through
another node left behind is swept at start: every layer whose job is not waiting for, or in,
evaluation."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from rollserve.storage import JobRecord
from rollserve.storage.base import Stage
from rollserve.trees import remove_tree

log = logging.getLogger(__name__)


class Layers:
    """The kept layers of one node's data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "layers"

    def path(self, job_id: str) -> Path:
        """Where the job's layer is kept (the directory itself is made by the keeping)."""
        return self._folder(job_id) / "layer"

    def _folder(self, job_id: str) -> Path:
        return self.root / hashlib.sha256(job_id.encode()).hexdigest()[:32]

    async def prepare(self, job_id: str) -> Path:
        """An empty place for the job's layer (an earlier attempt's is dropped)."""
        await self.drop(job_id)
        folder = self._folder(job_id)
        await asyncio.to_thread(folder.mkdir, parents=True)
        await asyncio.to_thread((folder / "job").write_text, job_id)
        return folder / "layer"

    async def drop(self, job_id: str) -> None:
        """Remove the job's layer, if it has one."""
        folder = self._folder(job_id)
        if await asyncio.to_thread(folder.exists):
            await asyncio.to_thread(remove_tree, folder)

    async def sweep(self, lookup: Callable[[str], Awaitable[JobRecord | None]]) -> int:
        """Drop the layers of jobs that are gone, ended, or not in evaluation; how many."""
        if not await asyncio.to_thread(self.root.is_dir):
            return 0
        dropped = 0
        for folder in await asyncio.to_thread(lambda: sorted(self.root.iterdir())):
            try:
                job_id = await asyncio.to_thread((folder / "job").read_text)
            except OSError:
                job_id = None
            record = await lookup(job_id) if job_id else None
            if record is not None and not record.status.terminal and record.stage == Stage.EVAL:
                continue
            await asyncio.to_thread(remove_tree, folder)
            dropped += 1
        if dropped:
            log.info("dropped %d kept layers of jobs no longer in evaluation", dropped)
        return dropped
