"""An OCI image layout directory: ``oci:DIR[:TAG]``, or a directory holding ``oci-layout``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollserve.errors import ImageNotFoundError
from rollserve.images.base import Located, file_stamp, split_tag
from rollserve.images.oci import DirBlobs, OciOpened, oci_manifest


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
