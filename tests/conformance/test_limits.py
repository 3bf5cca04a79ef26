"""Resource limits: a fork bomb and a memory hog stay inside their sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollserve.errors import SandboxClosedError
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.sandbox import SandboxLimits
from rollserve.settings import Settings
from rollserve.shell import ShellSession
from tests.conformance.conftest import require
from tests.leaks import sandbox_processes


async def test_fork_bomb_is_contained(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    limits = SandboxLimits(max_processes=64)
    box = await manager.start(spec_for(backend, limits=limits))
    bomb = asyncio.create_task(box.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=4))
    peak = 0
    while not bomb.done():
        if box.cgroup is not None:
            peak = max(peak, len(box.cgroup.pids()))
        await asyncio.sleep(0.05)
    result = await bomb
    assert result.timed_out or result.exit_code is not None
    if box.cgroup is not None:
        assert 0 < peak <= 64
    # The host still forks, and the sandbox is still usable after the bomb was killed.
    session = await ShellSession.open(box)
    assert (await session.run("echo survived")).output == "survived\n"
    procs = sandbox_processes(box)
    await manager.close(box)
    assert not [p for p in procs if p.alive()]


async def test_memory_hog_is_contained(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, limits=SandboxLimits(memory_mb=128)))
    result = await box.exec(
        "python3 -c \"b = b'x' * (512 * 1024 * 1024); print('allocated', len(b))\"", timeout=60
    )
    assert result.exit_code != 0
    assert "allocated" not in result.stdout
    after = await box.exec("echo fine")
    assert after.stdout == "fine\n"


async def test_file_size_limit(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, limits=SandboxLimits(max_file_size_mb=1)))
    result = await box.exec("head -c 3000000 /dev/zero > big; echo rc=$?; stat -c %s big")
    assert "rc=0" not in result.stdout
    assert result.stdout.strip().endswith("1048576")


async def test_wall_time_closes_the_sandbox(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, limits=SandboxLimits(wall_time_s=1.5)))
    session = await ShellSession.open(box)
    with pytest.raises(SandboxClosedError, match="wall-time"):
        await session.run("sleep 30", timeout=20)
    assert box.closed
    await box.close()  # idempotent: waits for the removal the expiry started
    assert not box.workspace.exists()
    assert box.id not in manager.live


async def test_rlimits_stand_in_where_cgroups_are_not_writable(
    settings: Settings, backend: str, tmp_path: Path
) -> None:
    no_cgroups = settings.model_copy(update={"cgroup_root": tmp_path / "no-cgroups"})
    async with SandboxManager(no_cgroups) as manager:
        require(manager, backend)
        box = await manager.start(spec_for(backend, limits=SandboxLimits(memory_mb=256)))
        assert box.cgroup is None
        result = await box.exec(
            "python3 -c \"b = b'x' * (512 * 1024 * 1024); print('allocated', len(b))\"",
            timeout=60,
        )
        assert result.exit_code != 0
        assert "MemoryError" in result.stderr
