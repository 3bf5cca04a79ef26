"""Image tests: layers written entry by entry, tiny images built from directories, and one
session-wide image made from the base root filesystem (with a git repository at /testbed)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from rollserve.fixtures.oci import LayerSpec, build_image
from rollserve.images import ImageStore
from rollserve.images.unpack import RootFs, Unpacked
from rollserve.settings import Settings
from tests.missing import missing
from tests.repos import git_repo

BASE_ROOTFS = Path("/opt/rollserve/images/base")
TOOLS_PATH = "/opt/tools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TESTBED_FILES = {"README": b"the image's repository\n", "calc.py": b"print(1 + 1)\n"}


# -- layers entry by entry -----------------------------------------------------------------------


Entry = tuple[tarfile.TarInfo, bytes | None]


def file(name: str, data: bytes = b"", mode: int = 0o644, owner: int = 0) -> Entry:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid = len(data), mode, owner, owner
    return info, data


def directory(name: str, mode: int = 0o755) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info, None


def link(name: str, target: str, *, hard: bool = False) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), target
    return info, None


def special(name: str, kind: bytes) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.devmajor, info.devminor = kind, 0o666, 1, 3
    return info, None


def layer(*entries: Entry) -> bytes:
    """An uncompressed layer tarball holding ``entries`` in this order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def apply(root: Path, *layers: bytes) -> Unpacked:
    """Apply ``layers`` to ``root`` as a conversion does: streamed, in order, then finished."""
    root.mkdir(parents=True, exist_ok=True)
    fs = RootFs(root)
    for data in layers:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            fs.apply(tar)
    return fs.finish()


# -- tiny images from directories ----------------------------------------------------------------


def tree(path: Path, files: dict[str, bytes]) -> Path:
    """A directory holding ``files`` (``a/b`` makes ``a/``)."""
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def tiny_image(tmp: Path, files: dict[str, bytes], *, name: str = "tiny", **kwargs: object) -> str:
    """An oci-archive (or ``fmt=``) of one layer holding ``files``; returns its reference."""
    out = tmp / (name if kwargs.get("fmt") == "oci" else f"{name}.tar")
    return build_image(out, [LayerSpec(tree(tmp / f"{name}-src", files))], **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def store(settings: Settings) -> ImageStore:
    return ImageStore(settings)


# -- the session's runnable image ----------------------------------------------------------------


def require_base_rootfs() -> Path:
    """The base root filesystem; a test without it skips (fails in CI)."""
    if not BASE_ROOTFS.is_dir():
        message = f"base image {BASE_ROOTFS} missing: run scripts/build-images.sh"
        missing(message)
    return BASE_ROOTFS


@pytest.fixture(scope="session")
def base_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``oci-archive:`` of the base root filesystem, a script dir on the image's PATH, and a git
    repository at /testbed (its WORKDIR); built once per session."""
    require_base_rootfs()
    tmp = tmp_path_factory.mktemp("base-image")
    tools = tree(tmp / "tools", {"bin/hello-tool": b"#!/bin/sh\necho tool says $FOO\n"})
    (tools / "bin/hello-tool").chmod(0o755)
    testbed = git_repo(tmp / "testbed", TESTBED_FILES)
    return build_image(
        tmp / "base.tar",
        [
            LayerSpec(BASE_ROOTFS),
            LayerSpec(testbed, prefix="/testbed", gzip=True),
            LayerSpec(tools, prefix="/opt/tools"),
        ],
        env={"PATH": TOOLS_PATH, "FOO": "bar"},
        workdir="/testbed",
    )


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One image cache for every test that runs commands in the base image: it is converted
    once."""
    return tmp_path_factory.mktemp("shared-image-cache")
