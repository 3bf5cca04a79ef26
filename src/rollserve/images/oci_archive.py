"""An OCI layout packed in a tarball: ``oci-archive:FILE[:TAG]``."""

from __future__ import annotations

from rollserve.images.oci import ArchiveSource, oci_manifest


class OciArchiveSource(ArchiveSource):
    """An OCI layout packed in a tarball (``oci-archive:FILE[:TAG]``)."""

    name = "oci-archive"
    reader = staticmethod(oci_manifest)
