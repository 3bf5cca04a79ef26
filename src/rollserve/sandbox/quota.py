"""The per-sandbox disk quota: the sandbox's writable files on a filesystem of their own, a sparse
ext4 image on a loop device mounted ``nosuid,nodev`` under the sandbox's state directory.

Writing past the quota fails inside the sandbox with ENOSPC while the host's disk keeps its space;
the image takes on disk only what was written, and it goes with the sandbox's directory on close
(the mount is detached first, which frees its loop device). Mounting needs root: elsewhere the
quota is reported as not enforced (:func:`unsupported_reason`), never silently dropped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import SandboxStartError

_MB = 1024 * 1024
_TOOLS = ("mkfs.ext4", "mount", "umount")
# No journal (the filesystem lives as long as its sandbox), no reserved blocks (the quota is
# the sandbox's to fill), inode tables initialised lazily: ~30 ms for 10 GB.
_MKFS = ["-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard"]


def unsupported_reason() -> str | None:
    """Why this host cannot enforce a disk quota (None: it can)."""
    if os.geteuid() != 0:
        return (
            f"needs root to mount a size-limited filesystem (running as uid {os.geteuid()}); "
            "the workspace is limited only by the host's disk"
        )
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (e2fsprogs, mount); the workspace is unlimited"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices here (/dev/loop-control is missing); the workspace is unlimited"
    return None


@dataclass
class DiskQuota:
    """One sandbox's quota: ``size_mb`` of space in the image file ``image``."""

    image: Path
    size_mb: int

    async def mount(self, target: Path) -> None:
        """Mount the quota's filesystem (made on first use) on the empty directory ``target``."""
        if not self.image.exists():
            await asyncio.to_thread(_sparse_file, self.image, self.size_mb * _MB)
            await _run("mkfs.ext4", *_MKFS, str(self.image))
        await _run("mount", "-t", "ext4", "-o", "loop,nosuid,nodev", str(self.image), str(target))
        await asyncio.to_thread(os.rmdir, target / "lost+found")  # not the sandbox's file

    async def unmount(self, target: Path) -> None:
        """Detach the filesystem from ``target`` (its loop device is freed with it)."""
        await _run("umount", str(target))


def _sparse_file(path: Path, size: int) -> None:
    with open(path, "xb") as fh:
        fh.truncate(size)


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled: let it finish, so the teardown sees its mount
            await asyncio.shield(proc.wait())
    if proc.returncode != 0:
        raise SandboxStartError(
            f"disk quota: {argv[0]} failed: {err.decode(errors='replace').strip()}"
        )
