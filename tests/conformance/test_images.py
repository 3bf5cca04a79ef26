"""Images: a root-filesystem directory for bwrap, a SIF file and a directory for Apptainer."""

from __future__ import annotations

import pytest

from rollserve.sandbox import SandboxManager, spec_for
from rollserve.shell import ShellSession
from tests.conformance.conftest import require
from tests.leaks import sandbox_processes
from tests.missing import missing


def _base_image(manager: SandboxManager, suffix: str = "") -> str:
    path = manager.settings.image_dir / f"base{suffix}"
    if not path.exists():
        message = f"base image {path} missing: run scripts/build-images.sh"
        missing(message, manager.settings)
    return str(path)


async def _image_facts(manager: SandboxManager, backend: str, image: str) -> str:
    box = await manager.start(spec_for(backend, image=image))
    session = await ShellSession.open(box)
    result = await session.run(
        "cat /etc/debian_version; command -v git patch tmux python3 | wc -l; pwd"
    )
    procs = sandbox_processes(box)
    await manager.close(box)
    assert not [p for p in procs if p.alive()]
    return result.output


async def test_bwrap_root_filesystem_image(manager: SandboxManager) -> None:
    require(manager, "bwrap")
    facts = await _image_facts(manager, "bwrap", _base_image(manager))
    assert facts.split("\n")[1:] == ["4", "/workspace", ""]
    assert facts.startswith("12.")


@pytest.mark.parametrize("suffix", ["", ".sif"])
async def test_apptainer_images(manager: SandboxManager, suffix: str) -> None:
    require(manager, "apptainer")
    facts = await _image_facts(manager, "apptainer", _base_image(manager, suffix))
    assert facts.split("\n")[1:] == ["4", "/workspace", ""]


async def test_named_image_resolves(manager: SandboxManager) -> None:
    require(manager, "apptainer")
    _base_image(manager)
    assert manager.images.expand("base") == str(manager.settings.image_dir.resolve() / "base")
    image = await manager.images.runnable("base", "apptainer")
    assert (image.kind, image.path) == ("dir", manager.settings.image_dir.resolve() / "base")
