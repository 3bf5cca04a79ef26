"""Layers applied to a root filesystem, the way container runtimes do: whiteouts remove what
lower layers made, and no entry can reach outside the root (symlinks in the image resolve as if
the root were ``/``, never on the host)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from rollserve.errors import ImageCorruptError
from rollserve.trees import remove_tree

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_MAX_HOPS = 40
_CHUNK = 1 << 20


@dataclass
class Unpacked:
    """What went into a root filesystem: files and bytes on disk."""

    files: int = 0
    size_bytes: int = 0
    dir_modes: dict[str, int] = field(default_factory=dict)


def entry_path(name: str) -> list[str]:
    """The components of a layer entry's path, relative to the root; ``..`` is refused."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageCorruptError(f"layer entry {name!r} climbs out of the root with '..'")
    return parts


class RootFs:
    """A root filesystem under construction on the host."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owned = os.geteuid() == 0  # only root can give files their image owners
        self.stats = Unpacked()

    def resolve(self, parts: list[str], *, create: bool) -> str | None:
        """The host path of directory ``parts`` with every symlink resolved inside the root;
        missing directories are made when ``create`` (else None)."""
        root = str(self.root)
        stack = list(reversed(parts))
        done: list[str] = []
        hops = 0
        while stack:
            part = stack.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            path = os.path.join(root, *done, part)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(path, 0o755)
                done.append(part)
                continue
            if stat.S_ISLNK(info.st_mode):
                hops += 1
                if hops > _MAX_HOPS:
                    raise ImageCorruptError(f"too many symlinks under /{'/'.join(parts)}")
                target = os.readlink(path)
                if target.startswith("/"):
                    done = []
                stack.extend(reversed(target.split("/")))
            elif stat.S_ISDIR(info.st_mode):
                done.append(part)
            elif create:  # a lower layer's file where this layer has a directory
                os.unlink(path)
                os.mkdir(path, 0o755)
                done.append(part)
            else:
                return None
        return os.path.join(root, *done)

    def apply(self, layer: tarfile.TarFile) -> None:
        """Apply one layer (a tar stream) on top of what is there."""
        added: set[str] = set()
        for member in layer:
            parts = entry_path(member.name)
            if not parts:
                continue
            base = parts[-1]
            if base.startswith(_WHITEOUT):
                self._whiteout(parts[:-1], base, added)
                continue
            parent = self.resolve(parts[:-1], create=True)
            assert parent is not None
            target = os.path.join(parent, base)
            self._replace(target, member)
            self._create(target, member, layer)
            added.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))

    def _whiteout(self, dir_parts: list[str], base: str, added: set[str]) -> None:
        parent = self.resolve(dir_parts, create=False)
        if parent is None:
            return
        prefix = "/".join(dir_parts)
        if base == _OPAQUE:
            _clear(parent, prefix, added)
            return
        _remove(os.path.join(parent, base[len(_WHITEOUT) :]))

    @staticmethod
    def _replace(target: str, member: tarfile.TarInfo) -> None:
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            return
        if member.isdir() and stat.S_ISDIR(info.st_mode):
            return  # directories merge
        _remove(target)

    def _create(self, target: str, member: tarfile.TarInfo, layer: tarfile.TarFile) -> None:
        if member.isdir():
            if not os.path.isdir(target):
                os.mkdir(target, 0o755)
            # Modes of directories are set at the end: a read-only one must stay writable
            # while later entries and layers go into it.
            self.stats.dir_modes[target] = member.mode & 0o7777
        elif member.isreg():
            source = layer.extractfile(member)
            assert source is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, _CHUNK)
            os.chmod(target, member.mode & 0o1777)
            self.stats.size_bytes += member.size
        elif member.issym():
            os.symlink(member.linkname, target)
        elif member.islnk():
            parts = entry_path(member.linkname)
            source_dir = self.resolve(parts[:-1], create=False)
            source_path = os.path.join(source_dir, parts[-1]) if source_dir and parts else None
            # lstat: a link to one of the image's symlinks links that symlink; following it
            # would look at the host.
            if source_path is None or _lmode(source_path) in (None, stat.S_IFDIR):
                raise ImageCorruptError(
                    f"hard link {member.name!r} points at {member.linkname!r}, which is no file"
                )
            os.link(source_path, target, follow_symlinks=False)
        elif member.isfifo():
            os.mkfifo(target, member.mode & 0o777)
        else:
            return  # device nodes: every sandbox gets a fresh /dev
        self.stats.files += 1
        if self.owned:
            os.lchown(target, member.uid, member.gid)
        if not member.issym():
            os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)

    def finish(self) -> Unpacked:
        """Set directory modes (deepest first) and return what was unpacked."""
        for path in sorted(self.stats.dir_modes, key=len, reverse=True):
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, self.stats.dir_modes[path])
        return self.stats


def _lmode(path: str) -> int | None:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def _clear(directory: str, prefix: str, keep: set[str]) -> None:
    """Remove what lower layers put in ``directory``: all but this layer's entries (``keep``:
    their paths and their parents'), and the lower entries inside the directories it keeps."""
    for name in os.listdir(directory):
        rel = f"{prefix}/{name}".lstrip("/")
        path = os.path.join(directory, name)
        if rel not in keep:
            _remove(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            _clear(path, rel, keep)


def _remove(path: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        remove_tree(Path(path))  # a layer may have left it unwritable
    else:
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
