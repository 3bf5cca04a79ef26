"""A ``docker save`` tarball: ``docker-archive:FILE[:REPO:TAG]``."""

from __future__ import annotations

from rollserve.images.oci import ArchiveSource, docker_manifest


class DockerArchiveSource(ArchiveSource):
    """A ``docker save`` tarball (``docker-archive:FILE[:TAG]``)."""

    name = "docker-archive"
    reader = staticmethod(docker_manifest)
