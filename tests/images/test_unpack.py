"""Layers applied to a root filesystem: order, whiteouts, links that stay inside the root,
modes; entries written one by one and applied with RootFs, no cache and no sandbox."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from rollserve.errors import ImageCorruptError
from tests.images.conftest import Entry, apply, directory, file, layer, link, special


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_layers_apply_in_order(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(
        root,
        layer(file("a.txt", b"one"), directory("d"), file("d/b", b"b1")),
        layer(file("a.txt", b"two"), file("d/c", b"c2")),
        layer(file("a.txt", b"three")),
    )
    assert (root / "a.txt").read_bytes() == b"three"
    assert listing(root) == ["a.txt", "d", "d/b", "d/c"]


def test_file_and_directory_replace_each_other(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(root, layer(directory("x"), file("x/y", b"y")), layer(file("x", b"now a file")))
    assert (root / "x").read_bytes() == b"now a file"
    apply(root, layer(file("x/z", b"z")))  # a directory again, made by its child's entry
    assert listing(root) == ["x", "x/z"]


def test_whiteout_removes_lower_file_and_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(
        root,
        layer(file("keep", b"k"), file("gone.txt", b"g"), file("d/sub/f", b"f"), file("d/g")),
        layer(file(".wh.gone.txt"), file("d/.wh.sub"), file("d/.wh.never-existed")),
    )
    assert listing(root) == ["d", "d/g", "keep"]


UPPER = [directory("d"), file("d/new", b"n"), directory("d/sub"), file("d/sub/new2", b"n")]
OPAQUE = file("d/.wh..wh..opq")


@pytest.mark.parametrize(
    "upper",
    [[OPAQUE, *UPPER], [*UPPER, OPAQUE], [file("d/new"), file("d/sub/new2"), OPAQUE]],
    ids=["marker-first", "marker-last", "no-directory-entries"],
)
def test_opaque_whiteout_clears_lower_directory_keeps_same_layer(
    tmp_path: Path, upper: list[Entry]
) -> None:
    root = tmp_path / "root"
    lower = layer(file("d/old", b"o"), file("d/sub/old2", b"o"), file("d/gone/x"), file("e/kept"))
    apply(root, lower, layer(*upper))
    assert listing(root) == ["d", "d/new", "d/sub", "d/sub/new2", "e", "e/kept"]


def test_absolute_symlink_resolves_inside_the_root(tmp_path: Path) -> None:
    host_etc = tmp_path / "host-etc"
    host_etc.mkdir()
    root = tmp_path / "root"
    apply(root, layer(link("etc", str(host_etc))), layer(file("etc/passwd", b"image user")))
    assert not (host_etc / "passwd").exists()
    inside = root / str(host_etc).lstrip("/") / "passwd"
    assert inside.read_bytes() == b"image user"
    assert os.readlink(root / "etc") == str(host_etc)  # the image's own link is kept as it is


def test_relative_symlink_cannot_climb_out(tmp_path: Path) -> None:
    root = tmp_path / "nested" / "root"
    apply(root, layer(link("up", "../../../../.."), file("up/escaped", b"x")))
    assert (root / "escaped").read_bytes() == b"x"
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "nested/escaped").exists()


def test_file_over_a_symlink_replaces_the_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"host data")
    root = tmp_path / "root"
    apply(root, layer(link("f", str(victim))), layer(file("f", b"image data")))
    assert victim.read_bytes() == b"host data"
    assert not (root / "f").is_symlink() and (root / "f").read_bytes() == b"image data"


@pytest.mark.parametrize("name", ["../../x", "a/../../x", "a/b/../../../x"])
def test_dotdot_entry_is_refused(tmp_path: Path, name: str) -> None:
    root = tmp_path / "deep" / "root"
    with pytest.raises(ImageCorruptError, match="climbs out"):
        apply(root, layer(file(name, b"x")))
    assert not (tmp_path / "x").exists() and not (tmp_path / "deep/x").exists()


def test_hard_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(
        root,
        layer(file("bin/a", b"same", mode=0o755), link("bin/b", "bin/a", hard=True)),
        layer(link("c", "./bin/a", hard=True)),
    )
    inodes = {(root / p).stat().st_ino for p in ("bin/a", "bin/b", "c")}
    assert len(inodes) == 1 and (root / "c").stat().st_nlink == 3


def test_hard_link_to_a_symlink_links_the_symlink(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(root, layer(link("s", "/only/in/the/image"), link("h", "s", hard=True)))
    assert os.readlink(root / "h") == "/only/in/the/image"
    assert (root / "h").lstat().st_ino == (root / "s").lstat().st_ino


@pytest.mark.parametrize("target", ["../../etc/passwd", "etc-link/passwd", "missing"])
def test_hard_link_that_leaves_the_image_is_refused(tmp_path: Path, target: str) -> None:
    root = tmp_path / "deep" / "root"
    with pytest.raises(ImageCorruptError):
        apply(root, layer(link("etc-link", "/etc"), link("h", target, hard=True)))
    assert not (root / "h").exists()


def test_modes_and_read_only_directories_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stats = apply(
        root,
        layer(
            file("run.sh", b"#!/bin/sh\n", mode=0o755),
            file("secret", b"s", mode=0o600),
            directory("ro", mode=0o555),
            directory("tmp", mode=0o1777),
        ),
        layer(file("ro/late", b"added into a read-only directory")),
    )
    modes = {p: stat.S_IMODE((root / p).stat().st_mode) for p in ("run.sh", "secret", "ro", "tmp")}
    assert modes == {"run.sh": 0o755, "secret": 0o600, "ro": 0o555, "tmp": 0o1777}
    assert (root / "ro/late").read_bytes() == b"added into a read-only directory"
    assert (stats.files, stats.size_bytes) == (5, 10 + 1 + 32)


def test_owners_kept_when_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(root, layer(file("owned", b"x", owner=1234)))
    info = (root / "owned").stat()
    expected = (1234, 1234) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    assert (info.st_uid, info.st_gid) == expected


def test_device_nodes_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stats = apply(
        root,
        layer(
            directory("dev"),
            special("dev/null", tarfile.CHRTYPE),
            special("dev/sda", tarfile.BLKTYPE),
            special("fifo", tarfile.FIFOTYPE),
        ),
    )
    assert listing(root) == ["dev", "fifo"]
    assert stat.S_ISFIFO((root / "fifo").lstat().st_mode) and stats.files == 2


def test_symlink_loop_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageCorruptError, match="too many symlinks"):
        apply(tmp_path / "root", layer(link("a", "b"), link("b", "a"), file("a/x")))
