"""docker:// images pulled from a registry (a local one, serving OCI layouts over the v2 API
with a bearer-token challenge), directly or as the docker.io mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.errors import ImageConversionError, ImageCorruptError, ImageNotFoundError
from rollserve.fixtures.oci_registry import LocalRegistry
from rollserve.images import ImageStore
from rollserve.images.remote import Reference
from rollserve.settings import Settings
from tests.images.conftest import tiny_image
from tests.servers import free_port

FILES = {"etc/motd": b"from the registry\n", "testbed/app.py": b"print('hi')\n"}


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    ref = tiny_image(tmp_path, FILES, name="layout", fmt="oci", tag="v1", env={"A": "1"})
    return Path(ref.removeprefix("oci:"))


def test_reference_parsing() -> None:
    assert Reference.parse("docker://ubuntu") == Reference("docker.io", "library/ubuntu", "latest")
    assert Reference.parse("docker://swebench/sweb.eval.x86_64.a_1776_b:latest") == Reference(
        "docker.io", "swebench/sweb.eval.x86_64.a_1776_b", "latest"
    )
    assert Reference.parse("docker://localhost:5000/team/img:v2") == Reference(
        "localhost:5000", "team/img", "v2"
    )
    digest = "sha256:" + "a" * 64
    assert Reference.parse(f"docker://ghcr.io/o/i@{digest}").reference == digest
    with pytest.raises(ImageNotFoundError, match="not a valid image reference"):
        Reference.parse("docker://Bad Name")


async def test_pull_with_a_token_challenge(settings: Settings, layout: Path) -> None:
    with LocalRegistry({"team/tiny": layout}, token="s3cret") as registry:
        ref = f"docker://{registry.host}/team/tiny:v1"
        store = ImageStore(settings)
        image = await store.runnable(ref, "bwrap")
        assert (image.path / "etc/motd").read_bytes() == FILES["etc/motd"]
        assert image.config.env == {"A": "1"}
        assert store.conversions == 1
        asked = len(registry.requests)
        assert asked >= 3  # the manifest (refused, then with the token), the config, a layer
        # Another process on the same cache: the reference is known, the registry is not asked.
        again = await ImageStore(settings).runnable(ref, "bwrap")
        assert again.path == image.path
        assert len(registry.requests) == asked
        store.release(image)


async def test_docker_hub_images_come_from_the_mirror(tmp_path: Path, layout: Path) -> None:
    with LocalRegistry({"team/tiny": layout}) as registry:
        settings = Settings(
            data_dir=tmp_path / "data",
            image_cache_dir=tmp_path / "cache",
            registry_mirror=f"http://{registry.host}",
        )
        cached = await ImageStore(settings).pull("docker://team/tiny:v1")
        assert (cached.rootfs / "testbed/app.py").is_file()
        assert cached.refs == ["docker://team/tiny:v1"]
        assert registry.requests[0] == "/v2/team/tiny/manifests/v1"


async def test_missing_tag_and_repository(settings: Settings, layout: Path) -> None:
    with LocalRegistry({"team/tiny": layout}) as registry:
        store = ImageStore(settings)
        with pytest.raises(ImageNotFoundError, match=r"team/tiny:v9.*no manifest v9"):
            await store.runnable(f"docker://{registry.host}/team/tiny:v9", "bwrap")
        with pytest.raises(ImageNotFoundError, match="team/other"):
            await store.runnable(f"docker://{registry.host}/team/other:v1", "bwrap")
    assert store.cache.all() == []


async def test_unreachable_registry(settings: Settings) -> None:
    ref = f"docker://127.0.0.1:{free_port()}/team/tiny:v1"
    with pytest.raises(ImageConversionError, match="cannot reach the registry"):
        await ImageStore(settings).runnable(ref, "bwrap")


async def test_corrupt_layer_from_the_registry(settings: Settings, layout: Path) -> None:
    blobs = sorted((layout / "blobs/sha256").iterdir(), key=lambda p: p.stat().st_size)
    biggest = blobs[-1]  # the layer
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    biggest.write_bytes(bytes(data))
    with LocalRegistry({"team/tiny": layout}) as registry:
        store = ImageStore(settings)
        with pytest.raises(ImageCorruptError, match="team/tiny"):
            await store.runnable(f"docker://{registry.host}/team/tiny:v1", "bwrap")
    assert store.cache.all() == []
    assert list(store.cache.tmp.iterdir()) == []
