"""Whether a node's data directory (its sandboxes' state and workspaces; the SQLite store, if
that is the store) has room for another sandbox."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

# Below this much free space the data directory counts as full: no new sandbox is made until
# there is room again.
MIN_FREE_BYTES = 16 * 1024 * 1024


class DataDirRoom:
    """Watches the free space of one data directory; says once when it fills and empties."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._full: str | None = None

    def full(self) -> str | None:
        """Why the data directory has no room for another sandbox (None: it has)."""
        try:
            free = shutil.disk_usage(self.data_dir).free
        except OSError as exc:
            return f"the data directory {self.data_dir} cannot be used: {exc.strerror}"
        if free >= MIN_FREE_BYTES:
            if self._full is not None:
                log.warning("the data directory has room again: sandboxes are made again")
                self._full = None
            return None
        reason = (
            f"the data directory {self.data_dir} is full ({free // 1024} KiB free, "
            f"{MIN_FREE_BYTES // 2**20} MiB needed): no sandbox is made until there is room"
        )
        if self._full is None:
            log.error("%s", reason)
        self._full = reason
        return reason
