"""Images that are already on disk in a runnable form: a root-filesystem (Apptainer sandbox)
directory, run as it is by every backend, and a SIF file, run as it is by Apptainer and
unpacked into the cache for the others."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import ImageConversionError, ImageNotFoundError
from rollserve.images.base import Located, Opened, file_stamp
from rollserve.images.oci import ImageConfig

SIF_SUFFIXES = (".sif", ".simg")
# What Apptainer writes for an image converted from OCI: the image's ENV, as shell exports.
_DOCKER_ENV = ".singularity.d/env/10-docker2singularity.sh"
_EXPORT = re.compile(r'^export (\w+)="(.*)"$')


class DirectorySource:
    """A root filesystem in a directory (an Apptainer sandbox directory)."""

    name = "dir"

    def claims(self, ref: str) -> bool:
        return ref.startswith("/") and not ref.endswith(SIF_SUFFIXES)

    def locate(self, ref: str) -> Located:
        path = Path(ref)
        if not path.is_dir():
            raise ImageNotFoundError(f"image directory {path} does not exist", image=ref)
        return Located(
            stamp=file_stamp(path),
            direct=path.resolve(),
            direct_for=frozenset({"bwrap", "apptainer"}),
        )

    def open(self, ref: str) -> AbstractContextManager[Opened]:
        raise ImageConversionError(f"{ref} is a directory: it is run as it is", image=ref)


@dataclass
class SifOpened:
    """A SIF file to unpack with ``apptainer build --sandbox``."""

    path: Path
    digest: str
    apptainer: str

    def unpack(self, rootfs: Path) -> tuple[ImageConfig, int, int]:
        rootfs.rmdir()  # apptainer makes the directory itself
        argv = [self.apptainer, "--silent", "build", "--force", "--sandbox"]
        proc = subprocess.run(
            [*argv, str(rootfs), str(self.path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ImageConversionError(
                f"unpacking {self.path} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}",
                image=str(self.path),
            )
        config = ImageConfig(env=_sif_env(rootfs / _DOCKER_ENV))
        files = size = 0
        for entry in rootfs.rglob("*"):
            if entry.is_file() and not entry.is_symlink():
                files += 1
                size += entry.stat().st_size
        return config, files, size


class SifSource:
    """A SIF file (``.sif``/``.simg``)."""

    name = "sif"

    def __init__(self, apptainer: str | None = None) -> None:
        self.apptainer = apptainer

    def claims(self, ref: str) -> bool:
        return ref.startswith("/") and ref.endswith(SIF_SUFFIXES)

    def locate(self, ref: str) -> Located:
        path = Path(ref)
        if not path.is_file():
            raise ImageNotFoundError(f"SIF image {path} does not exist", image=ref)
        return Located(
            stamp=file_stamp(path), direct=path.resolve(), direct_for=frozenset({"apptainer"})
        )

    @contextmanager
    def open(self, ref: str) -> Iterator[SifOpened]:
        binary = shutil.which(self.apptainer or "apptainer") or shutil.which("singularity")
        if binary is None:
            raise ImageConversionError(
                f"unpacking the SIF image {ref} needs apptainer (scripts/install-apptainer.sh)",
                image=ref,
            )
        digest = hashlib.sha256()
        with open(ref, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        yield SifOpened(Path(ref), "sha256:" + digest.hexdigest(), binary)


def _sif_env(script: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    try:
        lines = script.read_text().splitlines()
    except OSError:
        return env
    for line in lines:
        match = _EXPORT.match(line.strip())
        if match:
            env[match.group(1)] = match.group(2)
    return env
