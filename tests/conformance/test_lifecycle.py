"""Start, files, exec, close: nothing outlives a sandbox, whatever way it ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollserve.errors import SandboxClosedError, SandboxDiedError, ShellExitedError
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.settings import Settings
from rollserve.shell import ShellSession
from tests.conformance.conftest import require
from tests.leaks import Proc, cgroup_dirs, mounts_under, sandbox_processes
from tests.repos import git_repo


async def test_exec_separates_streams(sandbox: SandboxInstance) -> None:
    result = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)


async def test_exec_timeout(sandbox: SandboxInstance) -> None:
    result = await sandbox.exec("sleep 30", timeout=0.5)
    assert result.timed_out and result.exit_code is None


async def test_exec_timeout_of_a_command_flooding_its_output(sandbox: SandboxInstance) -> None:
    # The killed command's pipes are full: they must be drained for the exec to return.
    result = await asyncio.wait_for(sandbox.exec("yes; yes >&2", timeout=1), 30)
    assert result.timed_out and result.exit_code is None
    assert result.stdout.startswith("y\ny\n") and "output truncated" in result.stdout


async def test_exec_stdin(sandbox: SandboxInstance) -> None:
    result = await sandbox.exec(["wc", "-c"], stdin=b"12345")
    assert result.stdout.strip() == "5"


async def test_files_round_trip(sandbox: SandboxInstance) -> None:
    await sandbox.write_file("dir/a.bin", b"\x00\xffbinary")
    assert await sandbox.read_file("dir/a.bin") == b"\x00\xffbinary"
    assert await sandbox.read_file(f"{sandbox.guest_workspace}/dir/a.bin") == b"\x00\xffbinary"
    listed = await sandbox.exec("ls dir")
    assert listed.stdout == "a.bin\n"


async def test_template_is_copied_and_diffed(
    manager: SandboxManager, backend: str, tmp_path: Path
) -> None:
    require(manager, backend)
    template = tmp_path / "template"
    template.mkdir()
    (template / "keep.txt").write_text("one\n")
    box = await manager.start(spec_for(backend, template=template))
    session = await ShellSession.open(box)
    await session.run("echo two >> keep.txt && echo new > added.txt")
    assert (template / "keep.txt").read_text() == "one\n"  # the template is never touched
    diff = await box.diff()
    assert "+two" in diff and "+new" in diff and "a/keep.txt" in diff


async def test_git_workspace_diff(manager: SandboxManager, backend: str, tmp_path: Path) -> None:
    require(manager, backend)
    repo = git_repo(tmp_path / "repo", {"m.py": b"x = 1\n"})
    box = await manager.start(spec_for(backend, template=repo))
    await box.exec("sed -i 's/1/2/' m.py && echo y > new.py")
    diff = await box.diff()
    assert "-x = 1" in diff and "+x = 2" in diff and "new.py" in diff
    status = await box.exec("git status --porcelain")
    assert status.stdout.startswith(" M m.py")  # the agent's index is left as it was


async def test_close_leaves_nothing(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend))
    session = await ShellSession.open(box)
    await session.run("sleep 1000 & (sleep 1000 &); nohup sleep 1000 >/dev/null 2>&1 &")
    runner = asyncio.create_task(session.run("sleep 1000", timeout=None))
    await asyncio.sleep(0.3)
    procs = sandbox_processes(box)
    assert len(procs) >= 4
    await manager.close(box)
    with pytest.raises(SandboxClosedError):
        await runner
    await box.close()  # idempotent
    await _assert_gone(procs, box.workspace.parent, box.id)


async def test_cancelled_command_leaves_nothing(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend))
    session = await ShellSession.open(box)
    task = asyncio.create_task(session.run("sleep 1000 & sleep 1000", timeout=None))
    await asyncio.sleep(0.3)
    procs = sandbox_processes(box)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await manager.close(box)
    await _assert_gone(procs, box.workspace.parent, box.id)


async def test_sandbox_dying_mid_command_is_an_infrastructure_error(
    manager: SandboxManager, backend: str
) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend))
    session = await ShellSession.open(box)
    # A loop, so that a sweep racing a process still starting cannot end the command itself.
    task = asyncio.create_task(session.run("while :; do sleep 1000; done", timeout=None))
    await asyncio.sleep(0.3)
    for _ in range(50):
        for proc in sandbox_processes(box):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        if task.done():
            break
        await asyncio.sleep(0.2)
    with pytest.raises(SandboxDiedError):
        await task


async def test_exit_is_not_an_infrastructure_error(shell: ShellSession) -> None:
    with pytest.raises(ShellExitedError):
        await shell.run("exit 3")


async def test_killed_parent_leaves_nothing_after_restart(
    backend: str, settings: Settings, tmp_path: Path
) -> None:
    async with SandboxManager(settings) as probe:
        require(probe, backend)
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.owner_process", backend, str(settings.data_dir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert owner.stdout is not None
    report = json.loads(owner.stdout.readline())
    procs = [Proc(pid, ticks) for pid, ticks in report["procs"]]
    assert len(procs) >= 4 and all(p.alive() for p in procs)
    owner.kill()
    owner.wait()
    async with SandboxManager(settings) as restarted:
        assert report["id"] not in restarted.live
    await _assert_gone(procs, Path(report["dir"]), report["id"])


async def _assert_gone(procs: list[Proc], box_dir: Path, box_id: str) -> None:
    for _ in range(50):
        if not any(p.alive() for p in procs):
            break
        await asyncio.sleep(0.05)
    assert [p for p in procs if p.alive()] == []
    assert not box_dir.exists()
    assert mounts_under(box_dir.parent) == []
    assert cgroup_dirs(box_id) == []
