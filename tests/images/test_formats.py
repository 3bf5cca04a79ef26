"""Image formats: OCI layout directories, oci-archive and docker-archive tarballs, gzip and
plain layers, tags, and the config's Env and WorkingDir."""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from rollserve.errors import ImageNotFoundError
from rollserve.fixtures.oci import LayerSpec, build_image
from rollserve.images import ImageConfig, ImageStore
from rollserve.images.base import split_tag
from tests.images.conftest import tiny_image, tree

FORMATS = ["oci-archive", "oci", "docker-archive"]


def two_layers(tmp: Path, fmt: str, gzip: bool) -> str:
    """Layer 1 makes two files, layer 2 changes one and whites out the other."""
    lower = tree(tmp / "lower", {"etc/motd": b"lower\n", "etc/old": b"x", "bin/run": b"#!/bin/sh"})
    upper = tree(tmp / "upper", {"etc/motd": b"upper\n"})
    out = tmp / ("layout" if fmt == "oci" else "image.tar")
    return build_image(
        out,
        [LayerSpec(lower, gzip=gzip), LayerSpec(upper, whiteouts=["/etc/old"], gzip=gzip)],
        env={"PATH": "/opt/venv/bin:/usr/bin:/bin", "GREETING": "a=b c"},
        workdir="/testbed",
        fmt=fmt,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("fmt", FORMATS)
async def test_formats_unpack_with_config(
    tmp_path: Path, store: ImageStore, fmt: str, gzip: bool
) -> None:
    ref = two_layers(tmp_path, fmt, gzip)
    assert ref.startswith(f"{fmt}:")
    image = await store.pull(ref)
    assert (image.rootfs / "etc/motd").read_bytes() == b"upper\n"
    assert sorted(p.name for p in (image.rootfs / "etc").iterdir()) == ["motd"]
    assert (image.rootfs / "bin/run").read_bytes() == b"#!/bin/sh"
    assert image.env == {"PATH": "/opt/venv/bin:/usr/bin:/bin", "GREETING": "a=b c"}
    assert (image.workdir, image.refs, store.conversions) == ("/testbed", [ref], 1)


async def test_oci_layout_directory_without_prefix(tmp_path: Path, store: ImageStore) -> None:
    ref = tiny_image(tmp_path, {"hello": b"hi"}, fmt="oci")
    bare = ref.removeprefix("oci:")
    assert store.source(bare).name == "oci"  # holds oci-layout: not a root filesystem directory
    image = await store.runnable(bare, "bwrap")
    assert image.kind == "dir" and (image.path / "hello").read_bytes() == b"hi"
    store.release(image)


def merged_archive(tmp: Path, tags: list[str]) -> Path:
    """One oci-archive holding an image per tag (each with a file ``tag`` saying its tag)."""
    merged = tmp / "merged"
    manifests = []
    for tag in tags:
        ref = tiny_image(tmp, {"tag": tag.encode()}, name=tag, fmt="oci", tag=tag)
        layout = Path(ref.removeprefix("oci:"))
        shutil.copytree(layout, merged, dirs_exist_ok=True)
        manifests += json.loads((layout / "index.json").read_text())["manifests"]
    (merged / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    out = tmp / "merged.tar"
    with tarfile.open(out, "w") as tar:
        for entry in sorted(merged.rglob("*")):
            if entry.is_file():
                tar.add(entry, arcname=str(entry.relative_to(merged)))
    return out


async def test_archive_tag_selects_the_image(tmp_path: Path, store: ImageStore) -> None:
    archive = merged_archive(tmp_path, ["one", "two"])
    for tag in ("one", "two"):
        image = await store.pull(f"oci-archive:{archive}:{tag}")
        assert (image.rootfs / "tag").read_text() == tag
    with pytest.raises(ImageNotFoundError, match=r"no image tagged 'three' \(tags: one, two\)"):
        await store.pull(f"oci-archive:{archive}:three")
    with pytest.raises(
        ImageNotFoundError, match="holds 2 images: name one as .*" + re.escape(f"{archive}:TAG")
    ):
        await store.pull(f"oci-archive:{archive}")


async def test_docker_archive_tag(tmp_path: Path, store: ImageStore) -> None:
    ref = tiny_image(tmp_path, {"f": b"docker"}, fmt="docker-archive", tag="team/img:v1")
    image = await store.pull(f"{ref}:team/img:v1")
    assert (image.rootfs / "f").read_bytes() == b"docker"
    with pytest.raises(ImageNotFoundError, match="no image tagged 'v2'"):
        await store.pull(f"{ref}:v2")


def test_split_tag(tmp_path: Path) -> None:
    odd = tmp_path / "with:colon.tar"
    odd.touch()
    (tmp_path / "a.tar").touch()
    assert split_tag(f"{tmp_path}/a.tar:v1") == (tmp_path / "a.tar", "v1")
    assert split_tag(f"{tmp_path}/a.tar:ubuntu:22.04") == (tmp_path / "a.tar", "ubuntu:22.04")
    assert split_tag(f"{tmp_path}/a.tar") == (tmp_path / "a.tar", None)
    assert split_tag(str(odd)) == (odd, None)  # a path that exists has no tag
    assert split_tag(f"{odd}:v1") == (odd, "v1")
    assert split_tag(f"{tmp_path}/missing.tar:v1") == (tmp_path / "missing.tar", "v1")


def test_image_config_from_config() -> None:
    config = ImageConfig.from_config(
        {"config": {"Env": ["A=1", "B=x=y", "EMPTY=", "NOEQUALS", "=v"], "WorkingDir": "/"}}
    )
    assert config == ImageConfig(env={"A": "1", "B": "x=y", "EMPTY": ""}, workdir=None)
    assert ImageConfig.from_config({}) == ImageConfig()
    assert ImageConfig.from_config({"config": {"WorkingDir": "/src"}}).workdir == "/src"


async def test_root_filesystem_directory_runs_as_it_is(tmp_path: Path, store: ImageStore) -> None:
    rootfs = tree(tmp_path / "rootfs", {"etc/hostname": b"img"})
    image = await store.runnable(str(rootfs), "bwrap")
    assert (image.kind, image.path, image.digest) == ("dir", rootfs, None)
    host = await store.runnable("host", "bwrap")
    assert (host.kind, host.path, store.conversions) == ("host", Path("/"), 0)
