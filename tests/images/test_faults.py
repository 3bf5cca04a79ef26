"""Images that are missing or damaged: a clear error naming the image, and nothing of the
failed conversion left in the cache."""

from __future__ import annotations

import gzip
import io
import re
import tarfile
from pathlib import Path

import pytest

from rollserve.errors import ImageCorruptError, ImageNotFoundError
from rollserve.images import ImageStore
from tests.images.conftest import tiny_image

ARCHIVES = ["oci-archive", "docker-archive"]
PAYLOAD = b"PAYLOAD-ORIGINAL" * 64


def assert_cache_empty(store: ImageStore) -> None:
    tmp = store.cache.tmp
    assert store.cache.all() == []
    assert not tmp.exists() or list(tmp.iterdir()) == []


@pytest.mark.parametrize(
    "ref",
    ["oci-archive:{tmp}/nope.tar", "docker-archive:{tmp}/nope.tar:v1", "oci:{tmp}/nope"],
)
async def test_missing_image_is_named(tmp_path: Path, store: ImageStore, ref: str) -> None:
    ref = ref.format(tmp=tmp_path)
    with pytest.raises(ImageNotFoundError, match=re.escape(f"{tmp_path}/nope")) as caught:
        await store.runnable(ref, "bwrap")
    assert caught.value.details["image"] == ref
    assert_cache_empty(store)


async def test_unknown_names_and_kinds(store: ImageStore) -> None:
    with pytest.raises(ImageNotFoundError, match="image 'no-such-image' not found"):
        await store.runnable("no-such-image", "bwrap")
    with pytest.raises(ImageNotFoundError, match=r"of no known kind .*oci-archive"):
        await store.runnable("podman:thing", "bwrap")


def truncations(archive: Path) -> list[int]:
    """Cut points: an empty file, inside the first header, and inside every member's data."""
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.size > 1]
    return [0, 100, *(m.offset_data + m.size // 2 for m in members)]


@pytest.mark.parametrize("fmt", ARCHIVES)
async def test_truncated_archive(tmp_path: Path, store: ImageStore, fmt: str) -> None:
    ref = tiny_image(tmp_path, {"a": PAYLOAD, "b/c": b"c"}, fmt=fmt)
    archive = Path(ref.split(":", 1)[1])
    data = archive.read_bytes()
    for cut in truncations(archive):
        bad = tmp_path / f"cut-{cut}.tar"
        bad.write_bytes(data[:cut])
        with pytest.raises(ImageCorruptError, match=re.escape(str(bad))):
            await store.runnable(f"{fmt}:{bad}", "bwrap")
    assert_cache_empty(store)


@pytest.mark.parametrize("fmt", ARCHIVES)
async def test_garbage_archive(tmp_path: Path, store: ImageStore, fmt: str) -> None:
    bad = tmp_path / "garbage.tar"
    bad.write_bytes(bytes(range(256)) * 40)
    with pytest.raises(ImageCorruptError, match=re.escape(f"{bad} is not a readable tar archive")):
        await store.runnable(f"{fmt}:{bad}", "bwrap")
    assert_cache_empty(store)


@pytest.mark.parametrize("fmt", ARCHIVES)
async def test_altered_layer_fails_its_digest(tmp_path: Path, store: ImageStore, fmt: str) -> None:
    ref = tiny_image(tmp_path, {"a": PAYLOAD, "b/c": b"c"}, fmt=fmt)
    archive = Path(ref.split(":", 1)[1])
    data = archive.read_bytes()
    archive.write_bytes(data.replace(b"ORIGINAL", b"TAMPERED", 1))
    with pytest.raises(ImageCorruptError, match=r"layer sha256:\w+ is corrupt") as caught:
        await store.runnable(ref, "bwrap")
    assert caught.value.details["image"] == ref and ref in caught.value.message
    assert_cache_empty(store)


@pytest.mark.parametrize("fmt", ARCHIVES)
async def test_unreadable_manifest_names_the_image(
    tmp_path: Path, store: ImageStore, fmt: str
) -> None:
    ref = tiny_image(tmp_path, {"a": b"a"}, fmt=fmt)
    archive = Path(ref.split(":", 1)[1])
    bad = tmp_path / "bad.tar"
    with tarfile.open(archive) as src, tarfile.open(bad, "w") as out:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name in ("index.json", "manifest.json"):
                data = b"{not json"
                member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    with pytest.raises(ImageCorruptError, match=re.escape(str(bad)) + ".*is not valid JSON"):
        await store.runnable(f"{fmt}:{bad}", "bwrap")
    assert_cache_empty(store)


async def test_gzipped_archive_is_a_clear_error(tmp_path: Path, store: ImageStore) -> None:
    ref = tiny_image(tmp_path, {"a": b"a"})
    archive = Path(ref.split(":", 1)[1])
    zipped = tmp_path / "image.tar.gz"
    zipped.write_bytes(gzip.compress(archive.read_bytes()))
    with pytest.raises(ImageCorruptError, match=r"gzip-compressed: give the \.tar itself"):
        await store.runnable(f"oci-archive:{zipped}", "bwrap")
    assert_cache_empty(store)
