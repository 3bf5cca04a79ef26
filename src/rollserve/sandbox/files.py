"""Workspace files touched from the host without ever following a symlink, and tree diffs.

Sandbox processes share the workspace with rollserve and may swap any path component for a
symlink at any moment, so a host-side path check followed by an open is never safe. Files are
opened one component at a time relative to a directory descriptor with ``O_NOFOLLOW``; a path
that goes through a symlink is refused here (``SymlinkInPath``) and the caller reads it through
the sandbox instead, where the symlink resolves inside the sandbox's own view.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from rollserve.errors import SandboxPathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SymlinkInPath(Exception):
    """The path crosses a symlink (or a non-directory): use the sandbox to resolve it."""


def workspace_relative(guest_workspace: str, path: str) -> PurePosixPath | None:
    """``path`` (absolute in the sandbox, or relative to its workspace) relative to the
    workspace; None if it lies outside the workspace or climbs with ``..``."""
    guest = PurePosixPath(guest_workspace) / path
    try:
        rel = guest.relative_to(guest_workspace)
    except ValueError:
        return None
    if ".." in rel.parts or not rel.parts:
        return None
    return rel


def _open_beneath(root: Path, rel: PurePosixPath, flags: int, *, mkdirs: bool) -> int:
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in rel.parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not mkdirs:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        if flags & os.O_DIRECTORY:  # a directory to make (or find)
            with contextlib.suppress(FileExistsError):
                os.mkdir(rel.parts[-1], 0o755, dir_fd=fd)
            return os.open(rel.parts[-1], _DIR_FLAGS, dir_fd=fd)
        return os.open(rel.parts[-1], flags, 0o644, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SymlinkInPath(str(rel)) from exc
        raise SandboxPathError(f"cannot open {rel}: {exc.strerror}", path=str(rel)) from exc
    finally:
        os.close(fd)


def mount_point_beneath(root: Path, rel: PurePosixPath, directory: bool) -> None:
    """Make ``root/rel`` (a directory, or an empty file) where a bind will land, with its
    parents, never following a symlink; one that exists is left as it is."""
    flags = os.O_DIRECTORY if directory else os.O_WRONLY | os.O_CREAT
    os.close(_open_beneath(root, rel, flags, mkdirs=True))


def _regular(fd: int, rel: PurePosixPath) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise SandboxPathError(f"{rel} is not a regular file", path=str(rel))
    return info


def read_beneath(root: Path, rel: PurePosixPath, limit: int) -> bytes:
    """The bytes of the regular file ``root/rel``, at most ``limit`` of them."""
    fd = _open_beneath(root, rel, os.O_RDONLY, mkdirs=False)
    with os.fdopen(fd, "rb") as fh:
        if _regular(fd, rel).st_size > limit:
            raise SandboxPathError(f"{rel} is larger than {limit} bytes", path=str(rel))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise SandboxPathError(f"{rel} is larger than {limit} bytes", path=str(rel))
    return data


def write_beneath(root: Path, rel: PurePosixPath, data: bytes) -> None:
    """Create or replace the regular file ``root/rel`` (parents made as needed)."""
    fd = _open_beneath(root, rel, os.O_WRONLY | os.O_CREAT, mkdirs=True)
    with os.fdopen(fd, "wb") as fh:
        _regular(fd, rel)
        os.set_blocking(fd, True)
        fh.truncate(0)
        fh.write(data)


def tree_diff(template: Path | None, workspace: Path, scratch: Path, limit: int) -> str:
    """A git-style patch (binary files, symlinks and new files included) from ``template`` (or
    nothing) to ``workspace``, with ``a/``, ``b/`` paths; non-UTF-8 bytes are kept as
    surrogate escapes so that the patch encodes back to exactly what git produced."""
    base = Path(tempfile.mkdtemp(prefix="diff-", dir=scratch))  # one per call: calls may overlap
    try:
        return _git_no_index(base, template, workspace, limit)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _git_no_index(base: Path, template: Path | None, workspace: Path, limit: int) -> str:
    empty = base / "empty"
    empty.mkdir()
    (base / "a").symlink_to((template or empty).resolve())
    (base / "b").symlink_to(workspace.resolve())
    # The host's own git configuration must not apply (pagers, external diff drivers).
    env = {
        "PATH": "/usr/bin:/bin",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": str(base),
    }
    proc = subprocess.run(
        [
            "git",
            "diff",
            "--no-index",
            "--no-prefix",
            "--binary",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "a/",
            "b/",
        ],
        cwd=base,
        env=env,
        capture_output=True,
        check=False,
    )
    if proc.returncode > 1:
        message = proc.stderr.decode(errors="replace").strip()
        raise SandboxPathError(f"diff failed: {message}")
    if len(proc.stdout) > limit:
        raise SandboxPathError(f"the workspace diff is larger than {limit} bytes")
    return proc.stdout.decode("utf-8", errors="surrogateescape")
