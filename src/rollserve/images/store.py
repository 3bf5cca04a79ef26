"""The image store: turns an image reference into something a backend runs, converting it into
the cache once (one conversion per image however many sandboxes ask at once)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import ImageConversionError, ImageNotFoundError, RollserveError
from rollserve.images.base import ImageSource, Located, RunnableImage
from rollserve.images.cache import CachedImage, ImageCache
from rollserve.images.directory import DirectorySource
from rollserve.images.docker_archive import DockerArchiveSource
from rollserve.images.oci_archive import OciArchiveSource
from rollserve.images.oci_layout import OciLayoutSource
from rollserve.images.remote import RegistrySource
from rollserve.images.sif import SifSource
from rollserve.registry import Registry, made
from rollserve.settings import Settings

HOST = "host"


def source_factories() -> Registry[Callable[[Settings], ImageSource]]:
    """The built-in image sources by name, in the order they are asked to claim a reference."""
    factories: Registry[Callable[[Settings], ImageSource]] = Registry("image source")
    factories.register(OciArchiveSource.name, lambda settings: OciArchiveSource())
    factories.register(DockerArchiveSource.name, lambda settings: DockerArchiveSource())
    factories.register(OciLayoutSource.name, lambda settings: OciLayoutSource())
    factories.register(SifSource.name, lambda settings: SifSource(settings.apptainer_binary))
    factories.register(RegistrySource.name, _remote)
    factories.register(DirectorySource.name, lambda settings: DirectorySource())
    return factories


def _remote(settings: Settings) -> ImageSource:
    return RegistrySource(
        settings.image_cache / "tmp",
        settings.registry_mirror,
        settings.registry_insecure,
        settings.registry_timeout_s,
    )


def default_sources(settings: Settings) -> Registry[ImageSource]:
    """The built-in image sources, made for ``settings``."""
    return made(source_factories(), settings)


@dataclass
class _Hold:
    fd: int
    count: int


class ImageStore:
    """Image references → runnable images, through the node's image cache."""

    def __init__(self, settings: Settings, sources: Registry[ImageSource] | None = None) -> None:
        self.settings = settings
        self.sources = sources if sources is not None else default_sources(settings)
        self.cache = ImageCache(settings.image_cache, int(settings.image_cache_max_gb * 2**30))
        self.conversions = 0  # images this store unpacked (not found in the cache)
        self._pending: dict[str, asyncio.Future[CachedImage]] = {}
        self._known: dict[tuple[str, str], CachedImage] = {}
        self._held: dict[str, _Hold] = {}

    def expand(self, ref: str) -> str:
        """A bare name is a named image: ``IMAGES/NAME/`` or ``IMAGES/NAME.sif``."""
        if ref == HOST or ref.startswith("/") or ":" in ref:
            return ref
        base = self.settings.image_dir
        for candidate in (base / ref, base / f"{ref}.sif"):
            if candidate.exists():
                return str(candidate.resolve())
        raise ImageNotFoundError(
            f"image {ref!r} not found (looked for {base / ref}/ and {base / ref}.sif; other "
            "images are named by path, oci-archive:FILE, docker-archive:FILE, oci:DIR)",
            image=ref,
        )

    def source(self, ref: str) -> ImageSource:
        for name in self.sources:
            source = self.sources.get(name)
            if source.claims(ref):
                return source
        raise ImageNotFoundError(
            f"image {ref!r} is of no known kind (kinds: {', '.join(self.sources.names())}; "
            "a path must be absolute)",
            image=ref,
        )

    async def runnable(self, ref: str, backend: str, *, need_dir: bool = False) -> RunnableImage:
        """What ``backend`` runs for ``ref``; ``need_dir``: a directory is required (the
        workspace lives inside the image). Hold it until :meth:`release`."""
        ref = await asyncio.to_thread(self.expand, ref)
        if ref == HOST:
            return RunnableImage(kind="host", path=Path("/"), ref=ref)
        source = self.source(ref)
        located = await asyncio.to_thread(source.locate, ref)
        direct = located.direct
        if direct is not None and backend in located.direct_for:
            if direct.is_dir():
                return RunnableImage(kind="dir", path=direct, ref=ref)
            if not need_dir:
                return RunnableImage(kind="sif", path=direct, ref=ref)
        image = await self._converted(ref, source, located)
        try:
            self._hold(image)
        except FileNotFoundError:  # evicted by another process a moment ago: convert it again
            self._known.pop((ref, located.stamp), None)
            image = await self._converted(ref, source, located, refresh=True)
            self._hold(image)
        return RunnableImage(
            kind="dir", path=image.rootfs, ref=ref, config=image.config, digest=image.digest
        )

    async def pull(self, ref: str) -> CachedImage:
        """Convert ``ref`` into the cache now (``rollserve images pull``); a registry tag is
        resolved again, so a moved tag gets its new image."""
        ref = await asyncio.to_thread(self.expand, ref)
        source = self.source(ref)
        located = await asyncio.to_thread(source.locate, ref)
        return await self._converted(ref, source, located, refresh=True)

    async def _converted(
        self, ref: str, source: ImageSource, located: Located, *, refresh: bool = False
    ) -> CachedImage:
        key = (ref, located.stamp)
        known = self._known.get(key)
        if known is not None and known.rootfs.is_dir() and not refresh:
            return known
        pending = self._pending.get(ref)
        if pending is None:
            convert = functools.partial(self._convert, ref, source, located, refresh=refresh)
            pending = asyncio.ensure_future(asyncio.to_thread(convert))
            self._pending[ref] = pending
            pending.add_done_callback(lambda _: self._pending.pop(ref, None))
        image = await asyncio.shield(pending)
        self._known[key] = image
        return image

    def _convert(
        self, ref: str, source: ImageSource, located: Located, *, refresh: bool
    ) -> CachedImage:
        """Blocking: the cached image of ``ref``, converted if the cache lacks it."""
        digest = None if refresh else self.cache.ref_digest(ref, located.stamp)
        if digest is not None:
            image = self.cache.get(digest)
            if image is not None:
                return image
        try:
            with source.open(ref) as opened:
                image = self.cache.get(opened.digest)
                if image is None:
                    self.cache.clean_tmp()
                    image, converted = self.cache.convert(ref, opened)
                    self.conversions += converted
                    self.cache.evict(keep={image.digest, *self._held})
                else:
                    image = self.cache.add_ref(image, ref)
        except RollserveError:
            raise
        except PermissionError as exc:
            raise ImageConversionError(
                f"image {ref}: the image cache {self.cache.root} is not writable here ({exc}); "
                "set image_cache_dir (ROLLSERVE_IMAGE_CACHE_DIR) to a directory of this user's",
                image=ref,
            ) from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImageConversionError(f"image {ref}: {exc}", image=ref) from exc
        self.cache.remember(ref, located.stamp, image.digest)
        return image

    def _hold(self, image: CachedImage) -> None:
        hold = self._held.get(image.digest)
        if hold is None:
            self._held[image.digest] = _Hold(self.cache.hold(image), 1)
        else:
            hold.count += 1

    def release(self, image: RunnableImage) -> None:
        """The sandbox that ran ``image`` is gone."""
        if image.digest is None:
            return
        hold = self._held.get(image.digest)
        if hold is None:
            return
        hold.count -= 1
        if hold.count == 0:
            del self._held[image.digest]
            with contextlib.suppress(OSError):
                os.close(hold.fd)


__all__ = ["HOST", "ImageStore", "default_sources"]
