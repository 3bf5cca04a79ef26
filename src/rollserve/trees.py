"""Removing a directory tree whatever modes its files were left with: a sandbox's process, an
image's layers and overlayfs (its work directory is mode 000) all leave directories their owner
cannot enter or write until it changes their mode back."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any


def remove_tree(path: Path) -> None:
    """``rm -rf path``: directories that refuse to be listed or emptied are given their
    owner's permissions back and removed in turn. OSError if something still cannot go."""

    def onerror(func: Any, p: str, exc: Any) -> None:
        if isinstance(exc[1], FileNotFoundError):
            return
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
        if os.path.isdir(p) and not os.path.islink(p):
            with contextlib.suppress(OSError):
                os.chmod(p, stat.S_IRWXU)
            if func is os.rmdir:
                os.rmdir(p)
            else:  # it could not be listed: list and empty it now
                shutil.rmtree(p)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=onerror)
