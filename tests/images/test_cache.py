"""The image cache: converted once per content, shared across stores and processes, bounded
(least recently used go first, never an image in use), and clean after failures."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path

import pytest

from rollserve.errors import ImageCacheFullError
from rollserve.images import ImageSource, ImageStore, Located
from rollserve.images.base import Opened
from rollserve.images.oci_archive import OciArchiveSource
from rollserve.registry import Registry
from rollserve.sandbox.mountns import MountHolder, Tmpfs
from rollserve.settings import Settings
from tests.images.conftest import tiny_image


class CountingSource:
    """An oci-archive source that counts the times an image is opened for conversion."""

    name = "oci-archive"

    def __init__(self) -> None:
        self.inner = OciArchiveSource()
        self.opened = 0

    def claims(self, ref: str) -> bool:
        return self.inner.claims(ref)

    def locate(self, ref: str) -> Located:
        return self.inner.locate(ref)

    def open(self, ref: str) -> AbstractContextManager[Opened]:
        self.opened += 1
        return self.inner.open(ref)


def counting_store(settings: Settings) -> tuple[ImageStore, CountingSource]:
    source = CountingSource()
    registry: Registry[ImageSource] = Registry("image source")
    registry.register(source.name, source)
    return ImageStore(settings, registry), source


def rewrite(path: Path, data: bytes) -> None:
    """Replace a file (a new inode), as a rebuilt archive does."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(data)
    os.replace(fresh, path)


async def test_a_second_store_converts_nothing(tmp_path: Path, settings: Settings) -> None:
    ref = tiny_image(tmp_path, {"v": b"one"})
    archive = Path(ref.removeprefix("oci-archive:"))
    first_store = ImageStore(settings)
    first = await first_store.runnable(ref, "bwrap")
    first_store.release(first)
    store, source = counting_store(settings)
    again = await store.runnable(ref, "bwrap")
    assert (again.path, again.digest, store.conversions, source.opened) == (
        first.path,
        first.digest,
        0,
        0,
    )
    rewrite(archive, archive.read_bytes())  # same content, new stamp: read again, not unpacked
    same = await store.runnable(ref, "bwrap")
    assert (same.path, store.conversions, source.opened) == (first.path, 0, 1)
    other = tiny_image(tmp_path, {"v": b"two, longer"}, name="other")
    rewrite(archive, Path(other.removeprefix("oci-archive:")).read_bytes())
    changed = await store.runnable(ref, "bwrap")
    assert (changed.path / "v").read_bytes() == b"two, longer" and changed.digest != first.digest
    assert (store.conversions, source.opened) == (1, 2)
    for image in (again, same, changed):
        store.release(image)


async def test_two_refs_of_one_content_share_an_entry(
    tmp_path: Path, store: ImageStore, settings: Settings
) -> None:
    ref = tiny_image(tmp_path, {"v": b"one"})
    copy = tmp_path / "copy.tar"
    shutil.copy(ref.removeprefix("oci-archive:"), copy)
    first = await store.runnable(ref, "bwrap")
    other = ImageStore(settings)
    second = await other.runnable(f"oci-archive:{copy}", "bwrap")
    assert second.path == first.path and (store.conversions, other.conversions) == (1, 0)
    store.release(first)
    other.release(second)
    [entry] = store.cache.all()
    assert entry.refs == [ref, f"oci-archive:{copy}"]


async def test_concurrent_sandboxes_convert_once(tmp_path: Path, store: ImageStore) -> None:
    ref = tiny_image(tmp_path, {f"f{i}": os.urandom(4096) for i in range(200)})
    images = await asyncio.gather(*(store.runnable(ref, "bwrap") for _ in range(50)))
    assert store.conversions == 1 and {i.path for i in images} == {images[0].path}
    for image in images[1:]:
        store.release(image)
    assert store.cache.evict(max_bytes=0) == []  # one sandbox still holds it
    store.release(images[0])
    assert store.cache.evict(max_bytes=0) == [images[0].digest]


def test_two_stores_in_threads_convert_once(tmp_path: Path, settings: Settings) -> None:
    ref = tiny_image(tmp_path, {f"f{i}": os.urandom(8192) for i in range(500)})
    stores = [ImageStore(settings), ImageStore(settings)]
    start = threading.Barrier(len(stores))
    paths: list[Path] = []

    def run(store: ImageStore) -> None:
        start.wait()
        image = asyncio.run(store.runnable(ref, "bwrap"))
        paths.append(image.path)
        store.release(image)

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(s.conversions for s in stores) == 1
    assert len(paths) == 2 and paths[0] == paths[1]
    assert len(list(paths[0].iterdir())) == 500


def tick(directory: Path) -> None:
    """Wait until file times move on: they advance by clock ticks (ms), and the least recently
    used image is told by its use mark's time."""
    probe = directory / ".tick"
    probe.touch()
    before = probe.stat().st_mtime_ns
    while probe.stat().st_mtime_ns == before:
        time.sleep(0.001)
        probe.touch()


def bounded(settings: Settings, max_bytes: int) -> Settings:
    return Settings(
        data_dir=settings.data_dir,
        image_cache_dir=settings.image_cache,
        image_cache_max_gb=max_bytes / 2**30,
    )


async def test_least_recently_used_evicted_never_a_held_one(
    tmp_path: Path, settings: Settings
) -> None:
    settings = bounded(settings, 2500)  # room for two images of 1000 bytes
    store, other = ImageStore(settings), ImageStore(settings)
    refs = {n: tiny_image(tmp_path, {"f": n.encode() * 1000}, name=n) for n in "ABCD"}
    digests = {}
    for name in "AB":
        digests[name] = (await store.pull(refs[name])).digest
        tick(tmp_path)

    def cached() -> set[str]:
        return {n for n, d in digests.items() if store.cache.get(d) is not None}

    store.release(await store.runnable(refs["A"], "bwrap"))  # A used after B
    tick(tmp_path)
    digests["C"] = (await store.pull(refs["C"])).digest
    assert cached() == {"A", "C"}

    held = await other.runnable(refs["A"], "bwrap")  # another process's sandbox runs A
    tick(tmp_path)
    store.release(await store.runnable(refs["C"], "bwrap"))  # A is now the oldest
    tick(tmp_path)
    digests["D"] = (await store.pull(refs["D"])).digest
    assert cached() == {"A", "D"}

    other.release(held)
    assert store.cache.evict(max_bytes=1000) == [digests["A"]]
    assert cached() == {"D"}


async def test_held_image_survives_another_ref_added(
    tmp_path: Path, store: ImageStore, settings: Settings
) -> None:
    ref = tiny_image(tmp_path, {"v": b"one"})
    copy = tmp_path / "copy.tar"
    shutil.copy(ref.removeprefix("oci-archive:"), copy)
    held = await store.runnable(ref, "bwrap")
    other = ImageStore(settings)
    other.release(await other.runnable(f"oci-archive:{copy}", "bwrap"))
    assert store.cache.evict(max_bytes=0) == [] and held.path.is_dir()
    store.release(held)
    assert store.cache.evict(max_bytes=0) == [held.digest]


def test_clean_tmp_removes_dead_conversions_only(tmp_path: Path, settings: Settings) -> None:
    cache = ImageStore(settings).cache
    cache.ensure_dirs()
    live = "sha256:" + "a" * 64
    for name in (f"sha256-{'a' * 64}.1234", f"sha256-{'b' * 64}.5678", "evicted-99"):
        (cache.tmp / name / "rootfs/ro").mkdir(parents=True)
        (cache.tmp / name / "rootfs/ro/f").write_bytes(b"x")
        (cache.tmp / name / "rootfs/ro").chmod(0o555)
    with cache.lock(live):  # a conversion of this image is going on
        removed = cache.clean_tmp()
    assert sorted(removed) == sorted([f"sha256-{'b' * 64}.5678", "evicted-99"])
    assert [p.name for p in cache.tmp.iterdir()] == [f"sha256-{'a' * 64}.1234"]


@asynccontextmanager
async def small_tmpfs(path: Path, size_mb: int) -> AsyncIterator[Path]:
    """A full disk: a small tmpfs at ``path`` — on the host as root; otherwise in a user and
    mount namespace of its own, reached through its holder's /proc root as rollserve's own
    rootless workspaces are."""
    path.mkdir()
    if os.geteuid() != 0:
        holder = await MountHolder.start([Tmpfs(path, size_mb)])
        try:
            yield holder.host_path(path)
        finally:
            await holder.close()
        return
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def assert_nothing_half_written(store: ImageStore) -> None:
    assert store.cache.all() == []
    left = [p for p in store.cache.root.rglob("*") if p.is_file() and p.parent.name != "locks"]
    assert left == []


async def test_disk_full_is_a_clear_error(tmp_path: Path, settings: Settings) -> None:
    ref = tiny_image(tmp_path, {"big": os.urandom(8 << 20), "small": b"s"})
    async with small_tmpfs(tmp_path / "small-disk", 4) as disk:
        store = ImageStore(Settings(data_dir=settings.data_dir, image_cache_dir=disk))
        with pytest.raises(
            ImageCacheFullError, match="no space left .* converting " + re.escape(ref)
        ):
            await store.runnable(ref, "bwrap")
        assert_nothing_half_written(store)


async def test_image_over_the_bound_is_a_clear_error(tmp_path: Path, settings: Settings) -> None:
    ref = tiny_image(tmp_path, {"big": b"x" * 10_000})
    store = ImageStore(bounded(settings, 5000))
    with pytest.raises(ImageCacheFullError, match="larger than the image cache's bound") as caught:
        await store.runnable(ref, "bwrap")
    assert caught.value.details["image"] == ref
    assert_nothing_half_written(store)


async def test_an_image_evicted_by_another_process_is_converted_again(
    tmp_path: Path, settings: Settings
) -> None:
    ref = tiny_image(tmp_path, {"x": b"1"})
    store = ImageStore(settings)
    first = await store.runnable(ref, "bwrap")
    store.release(first)
    other = ImageStore(settings)  # another process on the same cache evicts it
    [cached] = other.cache.all()
    assert other.cache.remove(cached)
    again = await store.runnable(ref, "bwrap")
    assert (again.path / "x").read_bytes() == b"1"
    assert store.conversions == 2
    store.release(again)
