"""A SIF file (``.sif``/``.simg``): Apptainer runs it as it is; other backends (and a workspace
inside the image) get it unpacked into the cache with ``apptainer build --sandbox``."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import ImageConversionError, ImageNotFoundError
from rollserve.images.base import SIF_SUFFIXES, ImageConfig, Located, file_stamp

# What Apptainer writes for an image converted from OCI: the image's ENV, as shell exports.
_DOCKER_ENV = ".singularity.d/env/10-docker2singularity.sh"
_EXPORT = re.compile(r'^export (\w+)="(.*)"$')


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
