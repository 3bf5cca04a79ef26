"""OCI images built from directories, without Docker: for tests and for teams who want to make
a task image from a root filesystem they already have (``oci-archive`` or ``docker-archive``)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass
class LayerSpec:
    """One layer: a directory's contents put under ``prefix`` in the image, and whiteouts
    (paths a lower layer made that this layer removes)."""

    source: Path | None = None
    prefix: str = ""
    whiteouts: list[str] = field(default_factory=list)
    gzip: bool = False
    owner: tuple[int, int] | None = (0, 0)


def _readable(source: Path, arcname: str, info: tarfile.TarInfo) -> bool:
    """Whether this process may read the member (a directory: list it); always as root."""
    if os.geteuid() == 0 or info.issym():  # a link's target is the image's, not the host's
        return True
    path = source / Path(info.name).relative_to(arcname)
    return os.access(path, os.R_OK | (os.X_OK if info.isdir() else 0))


def _layer_bytes(spec: LayerSpec, scratch: Path) -> Path:
    path = Path(tempfile.mkstemp(dir=scratch, suffix=".tar")[1])
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:

        def owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if spec.source is not None and not _readable(spec.source, arcname, info):
                return None  # an ordinary user's image leaves out what it may not read
            if spec.owner is not None:
                info.uid, info.gid = spec.owner
                info.uname = info.gname = ""
            return info

        if spec.source is not None:
            arcname = spec.prefix.strip("/") or "."
            tar.add(spec.source, arcname=arcname, recursive=True, filter=owned)
        for name in spec.whiteouts:
            parent, _, base = name.strip("/").rpartition("/")
            info = tarfile.TarInfo(f"{parent}/.wh.{base}".lstrip("/"))
            tar.addfile(info, io.BytesIO(b""))
    if not spec.gzip:
        return path
    zipped = path.with_suffix(".tar.gz")
    with path.open("rb") as src, gzip.open(zipped, "wb", compresslevel=1) as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    path.unlink()
    return zipped


def _digest_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest(), path.stat().st_size


def build_image(
    out: Path,
    layers: list[LayerSpec],
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    tag: str = "latest",
    fmt: Literal["oci-archive", "oci", "docker-archive"] = "oci-archive",
) -> str:
    """Write an image to ``out`` (a tarball, or a directory for ``oci``); returns the image
    reference rollserve takes for it (``oci-archive:OUT`` …)."""
    scratch = Path(tempfile.mkdtemp(prefix="oci-build-"))
    try:
        files = [_layer_bytes(spec, scratch) for spec in layers]
        diff_ids = []
        for path, spec in zip(files, layers, strict=True):
            if spec.gzip:
                with gzip.open(path, "rb") as fh:
                    diff_ids.append("sha256:" + hashlib.file_digest(fh, "sha256").hexdigest())
            else:
                diff_ids.append(_digest_file(path)[0])
        config = {
            "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                os.uname().machine, "amd64"
            ),
            "os": "linux",
            "config": {
                "Env": [f"{k}={v}" for k, v in (env or {}).items()],
                "WorkingDir": workdir or "",
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        config_bytes = json.dumps(config).encode()
        blobs: dict[str, Path | bytes] = {}
        config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        blobs[config_digest] = config_bytes
        descriptors = []
        for path, spec in zip(files, layers, strict=True):
            digest, size = _digest_file(path)
            blobs[digest] = path
            media = LAYER_GZIP if spec.gzip else LAYER_TAR
            descriptors.append({"mediaType": media, "digest": digest, "size": size})
        if fmt == "docker-archive":
            _write_docker(out, config_bytes, files, tag)
            return f"docker-archive:{out}"
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config_bytes)},
            "layers": descriptors,
        }
        manifest_bytes = json.dumps(manifest).encode()
        manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
        blobs[manifest_digest] = manifest_bytes
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "annotations": {"org.opencontainers.image.ref.name": tag},
                }
            ],
        }
        entries: dict[str, Path | bytes] = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index).encode(),
        }
        for digest, blob in blobs.items():
            entries[f"blobs/sha256/{digest.split(':', 1)[1]}"] = blob
        if fmt == "oci":
            for name, blob in entries.items():
                target = out / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(blob if isinstance(blob, bytes) else blob.read_bytes())
            return f"oci:{out}"
        _write_tar(out, entries)
        return f"oci-archive:{out}"
    finally:
        for child in scratch.iterdir():
            child.unlink()
        scratch.rmdir()


def _write_tar(out: Path, entries: dict[str, Path | bytes]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for name, blob in entries.items():
            if isinstance(blob, bytes):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
            else:
                tar.add(blob, arcname=name)


def _write_docker(out: Path, config: bytes, layers: list[Path], tag: str) -> None:
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    entries: dict[str, Path | bytes] = {config_name: config}
    names = []
    for i, path in enumerate(layers):
        name = f"layer{i}/layer.tar"
        entries[name] = path
        names.append(name)
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": names}]
    entries["manifest.json"] = json.dumps(manifest).encode()
    _write_tar(out, entries)
