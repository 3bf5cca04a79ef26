"""A root filesystem in a directory (an Apptainer sandbox directory): every backend runs it as
it is."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from rollserve.errors import ImageConversionError, ImageNotFoundError
from rollserve.images.base import SIF_SUFFIXES, Located, Opened, file_stamp


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
