"""OCI images read from where they are stored (an OCI layout directory, an ``oci-archive`` or a
``docker-archive`` tarball): the manifest's digest, the image config, and its layers, each
checked against its digest while it is unpacked."""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, cast

from rollserve.errors import ImageCorruptError, ImageNotFoundError
from rollserve.images.base import ImageConfig, Located, file_stamp, split_tag
from rollserve.images.unpack import RootFs

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
REF_NAME = "org.opencontainers.image.ref.name"
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


@dataclass
class Layer:
    """One layer: the digest its bytes must have (compressed for OCI, uncompressed for a
    docker-archive) and where the bytes are."""

    digest: str
    location: str
    digest_is_uncompressed: bool = False


@dataclass
class Manifest:
    """An image resolved to one platform: its content address, config and layers."""

    digest: str
    config: dict[str, Any]
    layers: list[Layer]


class BlobStore(Protocol):
    """Where an image's blobs are: a directory, a tarball, a registry."""

    def open(self, location: str) -> IO[bytes]:
        """The bytes at ``location`` (``blobs/sha256/…`` or an archive member)."""
        ...

    def exists(self, location: str) -> bool: ...


class DirBlobs:
    """Blobs in an OCI layout directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, location: str) -> IO[bytes]:
        try:
            return (self.root / location).open("rb")
        except OSError as exc:
            raise ImageCorruptError(f"{self.root}: cannot read {location}: {exc}") from exc

    def exists(self, location: str) -> bool:
        return (self.root / location).is_file()


class TarBlobs:
    """Blobs inside an uncompressed tarball, read in place (tar members are seekable)."""

    def __init__(self, tar: tarfile.TarFile, name: str) -> None:
        self.tar = tar
        self.name = name
        self.members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}

    def open(self, location: str) -> IO[bytes]:
        member = self.members.get(location)
        if member is None:
            raise ImageCorruptError(f"{self.name} has no {location}")
        handle = self.tar.extractfile(member)
        assert handle is not None
        return handle

    def exists(self, location: str) -> bool:
        return location in self.members


@contextmanager
def open_archive(path: Path) -> Iterator[TarBlobs]:
    """An archive's members; a compressed archive is a clear error (unpack it first)."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise ImageNotFoundError(f"image archive {path} does not exist", image=str(path)) from None
    if magic.startswith(_GZIP):
        raise ImageCorruptError(
            f"{path} is gzip-compressed: give the .tar itself (gunzip it first)", image=str(path)
        )
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 (closed below, after the caller is done)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ImageCorruptError(f"{path} is not a readable tar archive: {exc}") from exc
    try:
        try:
            blobs = TarBlobs(tar, str(path))
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ImageCorruptError(f"{path} is not a readable tar archive: {exc}") from exc
        yield blobs
    finally:
        tar.close()


def read_json(blobs: BlobStore, location: str, name: str) -> Any:
    with blobs.open(location) as fh:
        return parse_json(fh.read(), location, name)


def parse_json(data: bytes, location: str, name: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImageCorruptError(f"{name}: {location} is not valid JSON: {exc}", image=name) from exc


def blob_path(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64:
        raise ImageCorruptError(f"unsupported or malformed digest {digest!r}")
    return f"blobs/sha256/{hexdigest}"


def host_platform() -> tuple[str, str]:
    machine = platform.machine()
    return "linux", _ARCH.get(machine, machine)


def oci_manifest(blobs: BlobStore, tag: str | None, name: str) -> Manifest:
    """The image of an OCI layout (``index.json``): the manifest tagged ``tag`` (or the only
    one), resolved through a multi-platform index to this host's platform."""
    if not blobs.exists("index.json"):
        raise ImageCorruptError(f"{name} is not an OCI layout (no index.json)", image=name)
    index = read_json(blobs, "index.json", name)
    descriptors = index.get("manifests") or []
    if tag is not None:
        chosen = [d for d in descriptors if (d.get("annotations") or {}).get(REF_NAME) == tag]
        if not chosen:
            tags = sorted(str((d.get("annotations") or {}).get(REF_NAME)) for d in descriptors)
            raise ImageNotFoundError(
                f"{name} has no image tagged {tag!r} (tags: {', '.join(tags) or 'none'})",
                image=name,
            )
    else:
        chosen = descriptors
    if len(chosen) != 1:
        raise ImageNotFoundError(
            f"{name} holds {len(chosen)} images: name one as {name}:TAG", image=name
        )
    return _resolve(blobs, chosen[0], name)


def _resolve(blobs: BlobStore, descriptor: dict[str, Any], name: str) -> Manifest:
    digest = str(descriptor.get("digest", ""))
    document = read_json(blobs, blob_path(digest), name)
    if document.get("mediaType") in INDEX_TYPES or "manifests" in document:
        want = host_platform()
        for entry in document.get("manifests") or []:
            plat = entry.get("platform") or {}
            if (plat.get("os"), plat.get("architecture")) == want:
                return _resolve(blobs, entry, name)
        raise ImageNotFoundError(f"{name} has no image for {want[0]}/{want[1]}", image=name)
    config_digest = str(document.get("config", {}).get("digest", ""))
    config = read_json(blobs, blob_path(config_digest), name)
    layers = [
        Layer(digest=str(entry["digest"]), location=blob_path(str(entry["digest"])))
        for entry in document.get("layers") or []
    ]
    return Manifest(digest=digest, config=config, layers=layers)


def docker_manifest(blobs: BlobStore, tag: str | None, name: str) -> Manifest:
    """The image of a ``docker save`` tarball (``manifest.json``), by repo tag or the only one;
    its content address is the image id (the config's digest)."""
    if not blobs.exists("manifest.json"):
        raise ImageCorruptError(f"{name} is not a docker-archive (no manifest.json)", image=name)
    entries = read_json(blobs, "manifest.json", name)
    if tag is not None:
        entries = [e for e in entries if tag in (e.get("RepoTags") or [])]
    if len(entries) != 1:
        what = f"no image tagged {tag!r}" if tag is not None else f"{len(entries)} images"
        raise ImageNotFoundError(f"{name} holds {what}", image=name)
    entry = entries[0]
    config_location = str(entry.get("Config", ""))
    with blobs.open(config_location) as fh:
        raw = fh.read()
    config = parse_json(raw, config_location, name)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    locations = entry.get("Layers") or []
    if len(diff_ids) != len(locations):
        raise ImageCorruptError(f"{name}: {len(locations)} layers but {len(diff_ids)} diff ids")
    layers = [
        Layer(digest=str(d), location=str(loc), digest_is_uncompressed=True)
        for d, loc in zip(diff_ids, locations, strict=True)
    ]
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    return Manifest(digest=digest, config=config, layers=layers)


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Hashing:
    """A read-only stream that hashes what passes through it."""

    def __init__(self, raw: _Readable) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        return data

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return "sha256:" + self.hash.hexdigest()


def apply_layer(
    blobs: BlobStore, layer: Layer, name: str, apply: Callable[[tarfile.TarFile], None]
) -> None:
    """Hand ``apply`` one layer as a tar stream, then check the layer's digest."""
    with blobs.open(layer.location) as raw:
        head = raw.read(4)
        outer = _Hashing(_Prefixed(head, raw))
        if head.startswith(_ZSTD):
            raise ImageCorruptError(
                f"{name}: layer {layer.digest} is zstd-compressed, which is not supported "
                "(use gzip or uncompressed layers)",
                image=name,
            )
        stream: Any = outer
        if head.startswith(_GZIP):
            stream = gzip.GzipFile(fileobj=cast(IO[bytes], outer), mode="rb")
        inner = _Hashing(stream) if layer.digest_is_uncompressed else None
        try:
            with tarfile.open(fileobj=cast(IO[bytes], inner or stream), mode="r|") as tar:
                apply(tar)
            got = inner.drain() if inner is not None else outer.drain()
            outer.drain()
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise ImageCorruptError(
                f"{name}: layer {layer.digest} is unreadable: {exc}", image=name
            ) from exc
    if got != layer.digest:
        raise ImageCorruptError(
            f"{name}: layer {layer.digest} is corrupt (its bytes hash to {got})", image=name
        )


class _Prefixed:
    """Bytes already read, then the rest of the stream."""

    def __init__(self, head: bytes, raw: IO[bytes]) -> None:
        self.head = head
        self.raw = raw

    def read(self, size: int = -1) -> bytes:
        if self.head:
            if size < 0:
                data, self.head = self.head + self.raw.read(), b""
                return data
            data, self.head = self.head[:size], self.head[size:]
            if len(data) < size:
                data += self.raw.read(size - len(data))
            return data
        return self.raw.read(size)


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


class ArchiveSource:
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
