"""The content-addressed image cache on disk, shared by every rollserve process of a machine.

```
CACHE/images/sha256-HEX/rootfs/      one converted image (its root filesystem)
CACHE/images/sha256-HEX/image.json   its digest, refs, config, size; written last: complete
CACHE/refs/KEY.json                  a reference → the digest it had (and the source's stamp)
CACHE/tmp/PID-RANDOM/                conversions in progress; moved into images/ when done
CACHE/locks/                         one lock file per digest (conversion) and per reference
```
A conversion holds its digest's lock exclusively, unpacks into tmp/ and renames the result into
place, so a reader sees a complete image or none. A process using an image holds a shared lock
on its directory (not on ``image.json``, which is replaced when a reference is added); eviction
(least recently used first) skips images so held.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollserve.errors import ImageCacheFullError, ImageConversionError
from rollserve.images.base import ImageConfig, Opened
from rollserve.trees import remove_tree

log = logging.getLogger(__name__)

_META = "image.json"


@dataclass
class CachedImage:
    """One converted image in the cache."""

    digest: str
    refs: list[str]
    env: dict[str, str]
    workdir: str | None
    files: int
    size_bytes: int
    created: float
    convert_s: float
    path: str = ""
    last_used: float = field(default=0.0)

    @property
    def rootfs(self) -> Path:
        return Path(self.path) / "rootfs"

    @property
    def config(self) -> ImageConfig:
        return ImageConfig(env=dict(self.env), workdir=self.workdir)


def _dir_name(digest: str) -> str:
    return digest.replace(":", "-")


class ImageCache:
    """The cache directory: lookups, conversions under locks, use marks, eviction."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.images = root / "images"
        self.refs = root / "refs"
        self.tmp = root / "tmp"
        self.locks = root / "locks"

    def ensure_dirs(self) -> None:
        for path in (self.images, self.refs, self.tmp, self.locks):
            path.mkdir(parents=True, exist_ok=True)

    # -- lookups ---------------------------------------------------------------------------------

    def get(self, digest: str) -> CachedImage | None:
        """The complete image with this digest, or None."""
        path = self.images / _dir_name(digest)
        try:
            data = json.loads((path / _META).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, json.JSONDecodeError):
            log.warning("image cache entry %s is unreadable; it will be converted again", path)
            return None
        data["path"] = str(path)
        data["last_used"] = _mtime(path / "used") or data.get("created", 0.0)
        return CachedImage(**{k: v for k, v in data.items() if k in CachedImage.__annotations__})

    def ref_digest(self, ref: str, stamp: str) -> str | None:
        """The digest ``ref`` had when the source looked like ``stamp``, if known."""
        try:
            data = json.loads(self._ref_file(ref).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if data.get("ref") != ref or data.get("stamp") != stamp:
            return None
        return str(data.get("digest"))

    def remember(self, ref: str, stamp: str, digest: str) -> None:
        """Note that ``ref`` (at ``stamp``) is the image ``digest``."""
        _write_json(self._ref_file(ref), {"ref": ref, "stamp": stamp, "digest": digest})

    def _ref_file(self, ref: str) -> Path:
        return self.refs / (hashlib.sha256(ref.encode()).hexdigest()[:40] + ".json")

    def all(self) -> list[CachedImage]:
        """Every complete image, most recently used first."""
        found = []
        for entry in self.images.iterdir() if self.images.is_dir() else []:
            image = self.get(entry.name.replace("-", ":", 1))
            if image is not None:
                found.append(image)
        return sorted(found, key=lambda i: i.last_used, reverse=True)

    # -- conversion ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock across processes (blocking: call it from a thread)."""
        self.locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path(_dir_name(name)), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _lock_path(self, name: str) -> Path:
        return self.locks / f"{name}.lock"

    def convert(self, ref: str, opened: Opened) -> tuple[CachedImage, bool]:
        """Unpack ``opened`` into the cache unless it is there already (blocking); whether
        this call converted it."""
        with self.lock(opened.digest):
            done = self.get(opened.digest)
            if done is not None:
                return self._add_ref(done, ref), False
            self.ensure_dirs()
            work = self.tmp / f"{_dir_name(opened.digest)}.{secrets.token_hex(4)}"
            started = time.monotonic()
            try:
                (work / "rootfs").mkdir(parents=True)
                config, files, size = opened.unpack(work / "rootfs")
                if size > self.max_bytes:
                    raise ImageCacheFullError(
                        f"image {ref} ({size / 2**30:.2f} GiB) is larger than the image cache's "
                        f"bound ({self.max_bytes / 2**30:.2f} GiB, setting image_cache_max_gb)",
                        image=ref,
                    )
                meta = {
                    "digest": opened.digest,
                    "refs": [ref],
                    "env": config.env,
                    "workdir": config.workdir,
                    "files": files,
                    "size_bytes": size,
                    "created": time.time(),
                    "convert_s": round(time.monotonic() - started, 3),
                }
                _write_json(work / _META, meta)
                (work / "used").touch()
                final = self.images / _dir_name(opened.digest)
                os.rename(work, final)
            except OSError as exc:
                remove_tree(work)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ImageCacheFullError(
                        f"no space left in the image cache {self.root} while converting {ref}",
                        image=ref,
                    ) from exc
                raise ImageConversionError(f"converting {ref} failed: {exc}", image=ref) from exc
            except BaseException:
                remove_tree(work)
                raise
        image = self.get(opened.digest)
        assert image is not None
        log.info("converted %s into %s in %.1fs", ref, final, image.convert_s)
        return image, True

    def add_ref(self, image: CachedImage, ref: str) -> CachedImage:
        """Note that ``ref`` names ``image`` too (blocking: call it from a thread)."""
        if ref in image.refs:
            return image
        with self.lock(image.digest):
            return self._add_ref(image, ref)

    def _add_ref(self, image: CachedImage, ref: str) -> CachedImage:
        if ref not in image.refs:
            meta_path = Path(image.path) / _META
            data = json.loads(meta_path.read_text())
            data["refs"] = [*data.get("refs", []), ref]
            _write_json(meta_path, data)
            image.refs.append(ref)
        return image

    def clean_tmp(self) -> list[str]:
        """Remove what conversions and evictions of dead processes left in tmp/."""
        removed = []
        for entry in self.tmp.iterdir() if self.tmp.is_dir() else []:
            digest_dir = entry.name.partition(".")[0]
            if not entry.name.startswith("evicted-"):
                fd = os.open(self._lock_path(digest_dir), os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # its conversion is still going on
                    remove_tree(entry)
                finally:
                    os.close(fd)
            else:
                remove_tree(entry)
            removed.append(entry.name)
        return removed

    # -- use and eviction ------------------------------------------------------------------------

    def hold(self, image: CachedImage) -> int:
        """A shared lock on the image (eviction skips it) and a use mark; returns the fd to
        close when done."""
        fd = os.open(image.path, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            os.utime(Path(image.path) / "used")
        return fd

    def evict(self, *, max_bytes: int | None = None, keep: set[str] | None = None) -> list[str]:
        """Remove images not in use, least recently used first, until the cache holds at most
        ``max_bytes`` (default: its bound); returns the removed digests."""
        bound = self.max_bytes if max_bytes is None else max_bytes
        images = sorted(self.all(), key=lambda i: i.last_used)
        total = sum(i.size_bytes for i in images)
        removed = []
        for image in images:
            if total <= bound:
                break
            if keep and image.digest in keep:
                continue
            if self.remove(image):
                total -= image.size_bytes
                removed.append(image.digest)
        return removed

    def remove(self, image: CachedImage) -> bool:
        """Remove one image unless a process holds it; whether it was removed."""
        path = Path(image.path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self.ensure_dirs()
            doomed = self.tmp / f"evicted-{secrets.token_hex(6)}"
            os.rename(path, doomed)
        finally:
            os.close(fd)
        remove_tree(doomed)
        return True


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
