"""One conformance suite over every registered image source: it claims its own references,
finds what they name (or says which is missing), and yields the same root filesystem."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import pytest

from rollserve.errors import ImageNotFoundError
from rollserve.fixtures.oci_registry import LocalRegistry
from rollserve.images import ImageStore, default_sources
from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings
from tests.conformance.conftest import require
from tests.images.conftest import tiny_image, tree

FILES = {"etc/motd": b"same everywhere\n", "srv/app/main.py": b"print('hi')\n"}

# name → (make the image under a directory: a context giving (reference, a missing reference))
Factory = Callable[[Path], AbstractContextManager[tuple[str, str]]]


def _archive(fmt: str) -> Factory:
    def make(tmp: Path) -> AbstractContextManager[tuple[str, str]]:
        ref = tiny_image(tmp, FILES, fmt=fmt)  # type: ignore[arg-type]
        prefix = ref.partition(":")[0]
        return nullcontext((ref, f"{prefix}:{tmp}/missing"))

    return make


def _directory(tmp: Path) -> AbstractContextManager[tuple[str, str]]:
    return nullcontext((str(tree(tmp / "rootfs", FILES)), f"{tmp}/missing-rootfs"))


def _sif(tmp: Path) -> AbstractContextManager[tuple[str, str]]:
    rootfs = tree(tmp / "rootfs", FILES)
    subprocess.run(
        ["apptainer", "--silent", "build", str(tmp / "image.sif"), str(rootfs)],
        check=True,
        capture_output=True,
    )
    return nullcontext((str(tmp / "image.sif"), f"{tmp}/missing.sif"))


@contextmanager
def _registry(tmp: Path) -> Iterator[tuple[str, str]]:
    layout = tiny_image(tmp, FILES, fmt="oci", tag="v1").removeprefix("oci:")
    with LocalRegistry({"team/image": Path(layout)}) as registry:
        yield f"docker://{registry.host}/team/image:v1", f"docker://{registry.host}/team/gone:v1"


FACTORIES: dict[str, Factory] = {
    "oci-archive": _archive("oci-archive"),
    "docker-archive": _archive("docker-archive"),
    "oci": _archive("oci"),
    "sif": _sif,
    "docker": _registry,
    "dir": _directory,
}


def test_every_registered_source_is_covered(settings: Settings) -> None:
    assert set(FACTORIES) == set(default_sources(settings).names())


@pytest.mark.parametrize("kind", list(FACTORIES))
async def test_source_conformance(kind: str, settings: Settings, tmp_path: Path) -> None:
    if kind == "sif":
        require(SandboxManager(settings), "apptainer")  # unpacking a SIF needs apptainer
    store = ImageStore(settings)
    with FACTORIES[kind](tmp_path) as (ref, missing):
        assert store.source(ref).name == kind
        assert store.source(missing).name == kind
        stamp = store.source(ref).locate(ref).stamp
        assert stamp and store.source(ref).locate(ref).stamp == stamp  # stable while unchanged
        image = await store.runnable(ref, "bwrap")
        assert image.kind == "dir"
        for name, data in FILES.items():
            assert (image.path / name).read_bytes() == data
        store.release(image)
        with pytest.raises(ImageNotFoundError, match=r"missing|gone"):
            await store.runnable(missing, "bwrap")
    assert not store.cache.tmp.exists() or list(store.cache.tmp.iterdir()) == []
