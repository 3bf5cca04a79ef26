"""A workspace inside an image (``/testbed``) made writable for one sandbox: an overlay mount
over the image's directory (the image stays untouched; ~ms per start) — on the host as root, in
a user and mount namespace of the sandbox's own otherwise (:mod:`rollserve.sandbox.mountns`) —
or a private copy (reflinked where the filesystem can; costs time in proportion to the files)
where the kernel refuses both."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rollserve.errors import InvalidInputError, SandboxStartError
from rollserve.images.base import RunnableImage
from rollserve.images.unpack import RootFs
from rollserve.sandbox.mountns import MountHolder, Overlay
from rollserve.sandbox.quota import DiskQuota

log = logging.getLogger(__name__)


@dataclass
class Layout:
    """How a workspace was made writable: ``overlay`` or ``copy``; ``holder`` is the mount
    namespace the overlay lives in where rollserve is not root (None: on the host)."""

    how: str
    holder: MountHolder | None = None
    why_not_overlay: str = ""  # for a copy: why the overlay could not be mounted
    upper: Path | None = None  # an overlay's upper directory: what the sandbox wrote


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
    source: Path,
    workspace: Path,
    scratch: Path,
    mode: str,
    quota: DiskQuota | None = None,
    note: Callable[[int], object] | None = None,
    layers: tuple[Path, ...] = (),
    keepable: bool = False,
) -> Layout:
    """Make ``workspace`` (an empty directory) a writable view of ``source`` (under
    ``layers``, which only an overlay can stack). With a ``quota`` (root only), what the
    sandbox writes (the overlay's upper directory, or the copy) lives on the quota's
    filesystem. ``note`` is told the PID of a mount namespace's holder as soon as it exists.
    ``keepable``: the layout names its upper directory, for the sandbox to keep."""
    problem: str | None = f"image_workspace is {mode!r}"
    if layers:
        mode = "overlay"
    if mode in ("auto", "overlay"):
        overlay = Overlay(source, scratch / "upper", scratch / "work", workspace, layers)
        if os.geteuid() != 0:
            problem = await asyncio.to_thread(_foreign, source)
            if problem is None:
                try:
                    holder = await MountHolder.start([overlay], note)
                    return Layout("overlay", holder, upper=overlay.upper if keepable else None)
                except SandboxStartError as exc:
                    problem = str(exc)
        else:
            if quota is not None:
                await quota.mount(scratch)
            problem = await _overlay(overlay)
            if problem is None:
                return Layout("overlay", upper=overlay.upper if keepable else None)
            if quota is not None:
                await quota.unmount(scratch)
        if mode == "overlay":
            raise SandboxStartError(f"cannot mount an overlay over {source}: {problem}")
        log.debug("overlay over %s not possible (%s): copying", source, problem)
    if quota is not None:
        await quota.mount(workspace)
    await copy_tree(source, workspace)
    return Layout("copy", why_not_overlay=problem or "")


def _foreign(source: Path) -> str | None:
    """Why an overlay in a user namespace could not write over ``source`` (None: it can):
    its files must belong to this user, as those of rollserve's own image cache do."""
    owner = source.stat().st_uid
    if owner == os.geteuid():
        return None
    return (
        f"{source} belongs to uid {owner}, not to this user (uid {os.geteuid()}): an overlay "
        "in a user namespace could not change its files (an image from the image cache, "
        "unpacked by this user, can be overlaid)"
    )


async def _overlay(overlay: Overlay) -> str | None:
    """Mount ``overlay`` on the host (as root); returns why not, or None."""
    try:
        options = overlay.options(userxattr=False)
    except SandboxStartError as exc:
        return str(exc)
    await asyncio.to_thread(_mkdirs, overlay.upper, overlay.work)
    proc = await asyncio.create_subprocess_exec(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        options,
        str(overlay.target),
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


async def keep_layer(upper: Path, dest: Path) -> str | None:
    """Move ``upper`` (an unmounted or idle overlay's upper directory) to ``dest``: a rename,
    or a copy that keeps whiteouts and extended attributes where ``upper`` is on another
    filesystem (a disk quota's); returns why that failed, or None."""
    try:
        await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(os.rename, upper, dest)
        return None
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            return str(exc)
    proc = await asyncio.create_subprocess_exec(
        "cp", "-a", "--reflink=auto", str(upper), str(dest),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    return None if proc.returncode == 0 else err.decode(errors="replace").strip()
