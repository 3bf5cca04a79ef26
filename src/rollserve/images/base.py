"""Image sources: where a sandbox image comes from (a .sif file, a directory, an OCI layout, an
``oci-archive``/``docker-archive`` tarball, a registry), behind one Protocol, registered by
name. Sandbox backends never convert anything: they ask the image store for a runnable image."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

RunnableKind = Literal["host", "dir", "sif"]
SIF_SUFFIXES = (".sif", ".simg")


@dataclass
class ImageConfig:
    """What an image asks of the processes it runs: environment and working directory."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ImageConfig:
        inner = config.get("config") or {}
        env: dict[str, str] = {}
        for item in inner.get("Env") or []:
            key, sep, value = str(item).partition("=")
            if sep and key:
                env[key] = value
        workdir = inner.get("WorkingDir") or None
        return cls(env=env, workdir=workdir if workdir not in (None, "/") else None)


@dataclass(frozen=True)
class Located:
    """A reference found where it points: a stamp that changes when the image changes, and the
    path a backend may run as it is (``direct``), for the backends in ``direct_for``."""

    stamp: str
    direct: Path | None = None
    direct_for: frozenset[str] = frozenset()


class Opened(Protocol):
    """An image opened for conversion: its content address, and how to unpack it."""

    @property
    def digest(self) -> str:
        """The image's content address (``sha256:…``)."""
        ...

    def unpack(self, rootfs: Path) -> tuple[ImageConfig, int, int]:
        """Write the root filesystem into the empty directory ``rootfs``; returns the image
        config, the number of files and their bytes."""
        ...


class ImageSource(Protocol):
    """A kind of image reference (``oci-archive:…``, ``docker://…``, a directory …)."""

    name: str

    def claims(self, ref: str) -> bool:
        """Whether ``ref`` is this kind's (cheap: a prefix or a stat)."""
        ...

    def locate(self, ref: str) -> Located:
        """Find the image (ImageNotFoundError naming it when it is not there)."""
        ...

    def open(self, ref: str) -> AbstractContextManager[Opened]:
        """Open it for conversion into the cache."""
        ...


@dataclass(frozen=True)
class RunnableImage:
    """What a backend runs: the host's own system (``host``), a root-filesystem directory, or
    a SIF file; with the image's environment and working directory."""

    kind: RunnableKind
    path: Path
    ref: str
    config: ImageConfig = field(default_factory=ImageConfig)
    digest: str | None = None


def file_stamp(path: Path) -> str:
    """A stamp of a file or directory that changes when it is replaced or rewritten."""
    info = os.stat(path)
    return f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"


def split_tag(rest: str) -> tuple[Path, str | None]:
    """``PATH[:TAG]``: the path is the shortest prefix ending before a colon that exists (a
    docker tag holds a colon itself: ``FILE:ubuntu:22.04``); a path that exists as given has no
    tag; when none exists, the path ends at the first colon."""
    if os.path.exists(rest) or ":" not in rest:
        return Path(rest), None
    colons = [i for i, ch in enumerate(rest) if ch == ":"]
    at = next((i for i in colons if os.path.exists(rest[:i])), colons[0])
    return Path(rest[:at]), rest[at + 1 :] or None
