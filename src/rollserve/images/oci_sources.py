"""The OCI family of image sources: an OCI layout directory (``oci:DIR[:TAG]`` or a directory
holding ``oci-layout``), an ``oci-archive:FILE[:TAG]`` and a ``docker-archive:FILE[:TAG]``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import ImageNotFoundError
from rollserve.images.base import Located, file_stamp, split_tag
from rollserve.images.oci import (
    BlobStore,
    DirBlobs,
    ImageConfig,
    Manifest,
    apply_layer,
    docker_manifest,
    oci_manifest,
    open_archive,
)
from rollserve.images.unpack import RootFs


@dataclass
class OciOpened:
    """An OCI image ready to unpack."""

    blobs: BlobStore
    manifest: Manifest
    name: str

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def unpack(self, rootfs: Path) -> tuple[ImageConfig, int, int]:
        fs = RootFs(rootfs)
        for layer in self.manifest.layers:
            apply_layer(self.blobs, layer, self.name, fs.apply)
        stats = fs.finish()
        return ImageConfig.from_config(self.manifest.config), stats.files, stats.size_bytes


class OciLayoutSource:
    """An OCI image layout directory."""

    name = "oci"

    def _path(self, ref: str) -> tuple[Path, str | None]:
        if ref.startswith("oci:"):
            return split_tag(ref.removeprefix("oci:"))
        return Path(ref), None

    def claims(self, ref: str) -> bool:
        return ref.startswith("oci:") or (Path(ref) / "oci-layout").is_file()

    def locate(self, ref: str) -> Located:
        path, _ = self._path(ref)
        if not (path / "index.json").is_file():
            raise ImageNotFoundError(
                f"OCI layout {path} not found (no index.json in it)", image=ref
            )
        return Located(stamp=file_stamp(path / "index.json"))

    @contextmanager
    def open(self, ref: str) -> Iterator[OciOpened]:
        path, tag = self._path(ref)
        blobs = DirBlobs(path)
        yield OciOpened(blobs, oci_manifest(blobs, tag, ref), ref)


class _ArchiveSource:
    """A tarball named by a prefix, ``PREFIX:FILE[:TAG]``."""

    name = ""
    reader: Callable[[BlobStore, str | None, str], Manifest]

    def claims(self, ref: str) -> bool:
        return ref.startswith(f"{self.name}:")

    def locate(self, ref: str) -> Located:
        path, _ = split_tag(ref.removeprefix(f"{self.name}:"))
        if not path.is_file():
            raise ImageNotFoundError(f"image archive {path} does not exist", image=ref)
        return Located(stamp=file_stamp(path))

    @contextmanager
    def open(self, ref: str) -> Iterator[OciOpened]:
        path, tag = split_tag(ref.removeprefix(f"{self.name}:"))
        with open_archive(path) as blobs:
            yield OciOpened(blobs, type(self).reader(blobs, tag, ref), ref)


class OciArchiveSource(_ArchiveSource):
    """An OCI layout packed in a tarball (``oci-archive:FILE[:TAG]``)."""

    name = "oci-archive"
    reader = staticmethod(oci_manifest)


class DockerArchiveSource(_ArchiveSource):
    """A ``docker save`` tarball (``docker-archive:FILE[:TAG]``)."""

    name = "docker-archive"
    reader = staticmethod(docker_manifest)
