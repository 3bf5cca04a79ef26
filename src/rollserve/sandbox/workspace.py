"""A workspace inside an image (``/testbed``) made writable for one sandbox: an overlay mount
over the image's directory (the image stays untouched; ~ms per start, needs root), or a private
copy (reflinked where the filesystem can; costs time in proportion to the files)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path, PurePosixPath

from rollserve.errors import InvalidInputError, SandboxStartError
from rollserve.images.base import RunnableImage
from rollserve.images.unpack import RootFs
from rollserve.sandbox.quota import DiskQuota

log = logging.getLogger(__name__)

_UNSAFE_IN_OPTIONS = (",", ":", "\\", "\n")


def image_directory(image: RunnableImage, guest: str) -> Path:
    """The host path of directory ``guest`` inside a directory image (symlinks resolved
    inside the image)."""
    resolved = RootFs(image.path).resolve(list(PurePosixPath(guest).parts[1:]), create=False)
    if resolved is None or not os.path.isdir(resolved):
        raise InvalidInputError(
            f"workspace {guest} is not a directory in image {image.ref}", workspace=guest
        )
    return Path(resolved)


async def lay_out(
    source: Path, workspace: Path, scratch: Path, mode: str, quota: DiskQuota | None = None
) -> str:
    """Make ``workspace`` (an empty directory) a writable view of ``source``; returns how
    (``overlay`` or ``copy``). With a ``quota``, what the sandbox writes (the overlay's upper
    directory, or the copy) lives on the quota's filesystem."""
    if mode in ("auto", "overlay"):
        if quota is not None:
            await quota.mount(scratch)
        problem = await _overlay(source, workspace, scratch)
        if problem is None:
            return "overlay"
        if quota is not None:
            await quota.unmount(scratch)
        if mode == "overlay":
            raise SandboxStartError(f"cannot mount an overlay over {source}: {problem}")
        log.debug("overlay over %s not possible (%s): copying", source, problem)
    if quota is not None:
        await quota.mount(workspace)
    await copy_tree(source, workspace)
    return "copy"


async def _overlay(source: Path, workspace: Path, scratch: Path) -> str | None:
    if os.geteuid() != 0:
        return "not root"
    paths = [str(source), str(scratch)]
    if any(ch in p for p in paths for ch in _UNSAFE_IN_OPTIONS):
        return "a path holds a character mount options cannot carry"
    upper, work = scratch / "upper", scratch / "work"
    await asyncio.to_thread(_mkdirs, upper, work)
    options = f"lowerdir={source},upperdir={upper},workdir={work}"
    proc = await asyncio.create_subprocess_exec(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        options,
        str(workspace),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        return err.decode(errors="replace").strip()
    return None


def _mkdirs(*paths: Path) -> None:
    for path in paths:
        path.mkdir()


async def copy_tree(source: Path, workspace: Path) -> None:
    """Copy ``source``'s contents into ``workspace`` (``cp -a``, reflinked where possible)."""
    proc = await asyncio.create_subprocess_exec(
        "cp",
        "-a",
        "--reflink=auto",
        f"{source}/.",
        str(workspace),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled: the copy must stop before the removal
            proc.kill()
            await asyncio.shield(proc.wait())
    if proc.returncode != 0:
        raise SandboxStartError(f"copying {source} failed: {err.decode().strip()}")
