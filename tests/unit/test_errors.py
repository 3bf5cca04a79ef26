"""Bad input gets a clear error naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rollserve.errors import (
    BackendUnavailableError,
    ImageConversionError,
    ImageNotFoundError,
    InvalidCommandError,
    TemplateNotFoundError,
    UnknownNameError,
)
from rollserve.registry import Registry
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.settings import Settings


def test_unknown_name_lists_the_known_ones() -> None:
    registry: Registry[int] = Registry("widget")
    registry.register("b", 2)
    registry.register("a", 1)
    with pytest.raises(UnknownNameError) as info:
        registry.get("c")
    assert "unknown widget 'c'; known: a, b" in str(info.value)
    assert info.value.to_dict()["error"]["code"] == "unknown_name"
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a", 3)


def test_unknown_backend() -> None:
    with pytest.raises(UnknownNameError, match="known: apptainer, bwrap, local"):
        spec_for("docker")


def test_spec_fields_are_checked() -> None:
    with pytest.raises(ValidationError, match="imagee"):
        spec_for("bwrap", imagee="host")
    with pytest.raises(ValidationError, match="memory_mb"):
        spec_for("bwrap", limits={"memory_mb": -1})


async def test_unknown_image(manager: SandboxManager) -> None:
    with pytest.raises(ImageNotFoundError, match="/no/such/rootfs"):
        await manager.start(spec_for("bwrap", image="/no/such/rootfs"))
    with pytest.raises(ImageNotFoundError, match="no-such-image"):
        await manager.images.runnable("no-such-image", "apptainer")
    with pytest.raises(ImageNotFoundError, match=r"relative/rootfs.*not found"):
        await manager.images.runnable("relative/rootfs", "bwrap")
    assert list(manager.settings.state_dir.iterdir()) == []  # nothing left of the attempt


async def test_broken_sif_given_to_bwrap(manager: SandboxManager, tmp_path: Path) -> None:
    # bwrap runs a SIF unpacked into the image cache; one that cannot be unpacked is an
    # infrastructure error naming it, and leaves nothing in the cache or the state directory.
    sif = tmp_path / "image.sif"
    sif.write_bytes(b"SIF")
    with pytest.raises(ImageConversionError, match=str(sif)):
        await manager.start(spec_for("bwrap", image=str(sif)))
    cache = manager.images.cache
    assert cache.all() == []
    assert not cache.tmp.exists() or list(cache.tmp.iterdir()) == []
    assert list(manager.settings.state_dir.iterdir()) == []


async def test_missing_binary(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, bwrap_binary="no-such-bwrap", apptainer_binary="no-such-apptainer"
    )
    async with SandboxManager(settings) as manager:
        with pytest.raises(BackendUnavailableError, match="no-such-bwrap"):
            await manager.start(spec_for("bwrap"))
        assert "no-such-apptainer" in manager.availability("apptainer").reason


async def test_missing_template(manager: SandboxManager, tmp_path: Path) -> None:
    with pytest.raises(TemplateNotFoundError, match="nope"):
        await manager.start(spec_for("local", template=tmp_path / "nope"))


async def test_nul_byte_in_exec(manager: SandboxManager) -> None:
    box = await manager.start(spec_for("local"))
    with pytest.raises(InvalidCommandError, match="NUL"):
        await box.exec(["echo", "a\x00b"])
