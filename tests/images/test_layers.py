"""A writable root: the image's whole filesystem writable for one sandbox through an overlay,
what it wrote kept as a layer when it closes, and that layer laid under a later sandbox's
root (how an evaluation sees everything an agent left, outside its workspace too)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rollserve.errors import InvalidInputError
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.settings import Settings
from tests.conformance.conftest import require
from tests.leaks import mounts_under

AGENT = (
    "set -e; echo made > /etc/agent-made; mkdir -p /opt/x && echo y > /opt/x/y; "
    "rm /etc/debian_version; echo more >> /testbed/README; mkdir -p /root; echo r > /root/r; "
    "echo t > /tmp/t; pwd"
)
CHECK = (
    "cat /etc/agent-made /opt/x/y /root/r; test ! -e /etc/debian_version && echo gone; "
    "tail -1 /testbed/README; cat /tmp/t 2>/dev/null || echo no-tmp"
)
# Apptainer gives every container a /tmp of its own (--containall): it is not in the layer.
SEEN = {"bwrap": "made\ny\nr\ngone\nmore\nt\n", "apptainer": "made\ny\nr\ngone\nmore\nno-tmp\n"}


@pytest.fixture(params=["bwrap", "apptainer"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def settings(tmp_path: Path, shared_cache: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", image_cache_dir=shared_cache)


async def test_a_kept_layer_carries_what_a_sandbox_wrote_anywhere(
    manager: SandboxManager, base_archive: str, tmp_path: Path, backend: str
) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, image=base_archive, writable_root=True))
    made = await box.exec(AGENT)
    assert (made.exit_code, made.stdout) == (0, "/testbed\n"), made.stderr  # WORKDIR
    assert await box.read_file("/testbed/README") != b""  # rollserve reads it from the root
    layer = tmp_path / "layers" / "job-1"
    await box.close_keeping_layer(layer)
    assert (layer / "etc" / "agent-made").read_text() == "made\n"
    [image] = manager.images.cache.all()
    assert not (image.rootfs / "etc" / "agent-made").exists()  # the cached image is untouched
    assert (image.rootfs / "etc" / "debian_version").exists()

    spec = spec_for(backend, image=base_archive, writable_root=True, lower_layers=[layer])
    evaluation = await manager.start(spec)
    seen = await evaluation.exec(CHECK)
    assert (seen.exit_code, seen.stdout) == (0, SEEN[backend]), seen.stderr
    await evaluation.exec("echo evaluation > /etc/agent-made")
    await manager.close(evaluation)
    assert (layer / "etc" / "agent-made").read_text() == "made\n"  # a lower layer stays as is
    assert mounts_under(manager.settings.data_dir) == []
    assert list(manager.settings.state_dir.iterdir()) == []


async def test_a_writable_root_without_a_kept_layer_leaves_nothing(
    manager: SandboxManager, base_archive: str, backend: str
) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, image=base_archive, writable_root=True))
    assert (await box.exec("echo x > /etc/x && cat /etc/x")).stdout == "x\n"
    await manager.close(box)
    assert list(manager.settings.state_dir.iterdir()) == []
    again = await manager.start(spec_for(backend, image=base_archive, writable_root=True))
    assert (await again.exec("test -e /etc/x || echo fresh")).stdout == "fresh\n"
    await manager.close(again)


async def test_refusals_name_what_is_wrong(
    manager: SandboxManager, base_archive: str, tmp_path: Path
) -> None:
    require(manager, "bwrap")
    with pytest.raises(ValidationError, match="set writable_root"):
        spec_for("bwrap", image=base_archive, lower_layers=[tmp_path])
    with pytest.raises(ValidationError, match="absolute"):
        spec_for("bwrap", image=base_archive, writable_root=True, lower_layers=["rel"])
    gone = tmp_path / "gone"
    spec = spec_for("bwrap", image=base_archive, writable_root=True, lower_layers=[gone])
    with pytest.raises(InvalidInputError, match=f"lower layer {gone} is not a directory"):
        await manager.start(spec)
    box = await manager.start(spec_for("bwrap", image=base_archive))
    with pytest.raises(InvalidInputError, match="no layer to keep"):
        await box.close_keeping_layer(tmp_path / "layer")
    await manager.close(box)
    assert list(manager.settings.state_dir.iterdir()) == []
