"""Sandboxes run an OCI image: its ENV for every process, its /testbed as a private writable
workspace (an overlay or a copy) whose diff is against the image's commit, the cached image
never touched, and nothing left on the host once closed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollserve.errors import InvalidInputError
from rollserve.images import CachedImage
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.settings import Settings
from rollserve.shell import ShellSession
from tests.conformance.conftest import require
from tests.images.conftest import TESTBED_FILES
from tests.leaks import Proc, mounts_under, sandbox_processes


@pytest.fixture(params=["bwrap", "apptainer"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workspace_mode() -> str:
    return "auto"


@pytest.fixture
def settings(tmp_path: Path, shared_cache: Path, workspace_mode: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", image_cache_dir=shared_cache, image_workspace=workspace_mode
    )


def cached(manager: SandboxManager, ref: str) -> CachedImage:
    [image] = [i for i in manager.images.cache.all() if ref in i.refs]
    return image


async def test_image_env_reaches_exec_and_shell(
    manager: SandboxManager, backend: str, base_archive: str
) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, image=base_archive))
    script = "command -v hello-tool; hello-tool; pwd; git log --format=%s"
    expected = "/opt/tools/bin/hello-tool\ntool says bar\n/testbed\ninit\n"  # WORKDIR: /testbed
    result = await box.exec(script)
    assert (result.exit_code, result.stdout, result.stderr) == (0, expected, "")
    session = await ShellSession.open(box)
    shell = await session.run(script)
    await session.close()
    assert (shell.exit_code, shell.output) == (0, expected)
    await manager.close(box)


async def test_spec_env_overrides_the_image(
    manager: SandboxManager, backend: str, base_archive: str
) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, image=base_archive, env={"FOO": "spec"}))
    result = await box.exec("echo $FOO; hello-tool")
    assert result.stdout == "spec\ntool says spec\n"
    await manager.close(box)


async def test_template_keeps_workspace_at_workspace(
    manager: SandboxManager, backend: str, base_archive: str, tmp_path: Path
) -> None:
    require(manager, backend)
    template = tmp_path / "template"
    template.mkdir()
    (template / "mine").write_text("template file\n")
    box = await manager.start(spec_for(backend, image=base_archive, template=template))
    result = await box.exec("pwd; cat mine; cat /testbed/README")
    assert result.stdout == "/workspace\ntemplate file\nthe image's repository\n"
    await manager.close(box)


@pytest.mark.parametrize("workspace", ["/testbed", None], ids=["workspace", "workdir"])
@pytest.mark.parametrize("workspace_mode", ["overlay", "copy"])
async def test_workspace_in_image_is_private(
    manager: SandboxManager,
    backend: str,
    base_archive: str,
    settings: Settings,
    workspace_mode: str,
    workspace: str | None,
) -> None:
    require(manager, backend)
    spec = spec_for(backend, image=base_archive, workspace=workspace)
    box, other = await manager.start(spec), await manager.start(spec)
    assert box.workspace_mode == workspace_mode
    if os.geteuid() == 0:
        # An overlay is a mount on the host; so is a copy on the disk quota's filesystem.
        quota = spec.limits.disk_mb is not None and "disk_mb" not in box.unenforced
        assert bool(mounts_under(box.workspace)) == (workspace_mode == "overlay" or quota)
    edit = await box.exec("echo changed >> README && echo new > added.txt && rm calc.py")
    assert edit.exit_code == 0, edit.stderr
    diff = await box.diff()
    assert "diff --git a/README b/README" in diff and "+changed" in diff
    assert "diff --git a/added.txt b/added.txt\nnew file mode 100644" in diff
    assert "diff --git a/calc.py b/calc.py\ndeleted file mode 100644" in diff
    assert (await other.exec("ls; git status --porcelain")).stdout == "README\ncalc.py\n"
    testbed = cached(manager, base_archive).rootfs / "testbed"
    assert {p.name for p in testbed.iterdir()} == {".git", *TESTBED_FILES}
    assert (testbed / "README").read_bytes() == TESTBED_FILES["README"]
    procs = sandbox_processes(box) + sandbox_processes(other)
    await manager.close(box)
    await manager.close(other)
    assert mounts_under(settings.data_dir) == []
    assert [p for p in procs if p.alive()] == []
    assert list(settings.state_dir.iterdir()) == []


@pytest.mark.parametrize("workspace", ["/testbed/README", "/nowhere", "/opt/tools/bin/hello-tool"])
async def test_workspace_must_be_a_directory_in_the_image(
    manager: SandboxManager, backend: str, base_archive: str, settings: Settings, workspace: str
) -> None:
    require(manager, backend)
    spec = spec_for(backend, image=base_archive, workspace=workspace)
    with pytest.raises(InvalidInputError, match=f"workspace {workspace} is not a directory"):
        await manager.start(spec)
    assert manager.live == {} and list(settings.state_dir.iterdir()) == []
    assert mounts_under(settings.data_dir) == []


def test_template_and_workspace_together_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="a template or a workspace inside the image"):
        spec_for("bwrap", image="oci-archive:/x.tar", template=tmp_path, workspace="/testbed")


@pytest.mark.parametrize("workspace", ["testbed", "/", "/a/../b", "/etc/app", "/usr"])
def test_workspace_must_be_a_plain_absolute_directory(workspace: str) -> None:
    with pytest.raises(ValidationError, match="workspace"):
        spec_for("bwrap", image="oci-archive:/x.tar", workspace=workspace)


async def test_a_killed_owner_leaves_no_mount_after_restart(
    backend: str, settings: Settings, base_archive: str
) -> None:
    async with SandboxManager(settings) as probe:
        require(probe, backend)
    argv = [sys.executable, "-m", "tests.conformance.owner_process", backend]
    argv += [str(settings.data_dir), base_archive, str(settings.image_cache)]
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    assert owner.stdout is not None
    report = json.loads(owner.stdout.readline())
    procs = [Proc(pid, ticks) for pid, ticks in report["procs"]]
    box_dir = Path(report["dir"])
    assert all(p.alive() for p in procs)
    if os.geteuid() == 0:
        assert mounts_under(box_dir) != []  # the overlay over the image's /testbed
    owner.kill()
    owner.wait()
    async with SandboxManager(settings) as restarted:  # entering reaps what the owner left
        image = await restarted.images.runnable(base_archive, backend)
        assert (image.path / "testbed" / "README").read_bytes() == TESTBED_FILES["README"]
        restarted.images.release(image)
    for _ in range(50):
        if not any(p.alive() for p in procs):
            break
        await asyncio.sleep(0.05)
    assert [p for p in procs if p.alive()] == []
    assert mounts_under(settings.data_dir) == []
    assert not box_dir.exists()
