"""Isolation: network, file system, and sandboxes from each other."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rollserve.errors import InvalidInputError
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.shell import ShellSession
from tests.conformance.conftest import require

_INTERFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"


async def test_network_off_by_default(manager: SandboxManager, isolating_backend: str) -> None:
    require(manager, isolating_backend)
    box = await manager.start(spec_for(isolating_backend))
    result = await box.exec(_INTERFACES)
    assert result.stdout.split() == ["lo"]


async def test_network_on_when_asked(manager: SandboxManager, isolating_backend: str) -> None:
    require(manager, isolating_backend)
    host = sorted(
        line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]
    )
    box = await manager.start(spec_for(isolating_backend, network=True))
    result = await box.exec(_INTERFACES)
    assert sorted(result.stdout.split()) == host


async def test_nothing_outside_the_workspace_reaches_the_host(
    manager: SandboxManager, isolating_backend: str, tmp_path: Path
) -> None:
    require(manager, isolating_backend)
    box = await manager.start(spec_for(isolating_backend))
    probe = f"rollserve-probe-{os.getpid()}"
    targets = ["/", "/etc", "/usr", "/usr/bin", "/var", "/opt", "/home", str(tmp_path)]
    script = "; ".join(f"echo x > {t.rstrip('/')}/{probe} 2>/dev/null" for t in targets)
    await box.exec(script + f"; echo x > /workspace/{probe}")
    for target in targets:
        assert not Path(target, probe).exists(), f"sandbox wrote {target}/{probe} on the host"
    assert (box.workspace / probe).read_text() == "x\n"


async def test_system_directories_are_read_only(manager: SandboxManager) -> None:
    require(manager, "bwrap")
    box = await manager.start(spec_for("bwrap"))
    for path in ("/usr/x", "/etc/x", "/x"):
        result = await box.exec(f"echo x > {path}")
        assert result.exit_code != 0
        assert "Read-only file system" in result.stderr


async def test_host_files_are_invisible(
    manager: SandboxManager, isolating_backend: str, tmp_path: Path
) -> None:
    require(manager, isolating_backend)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    box = await manager.start(spec_for(isolating_backend))
    result = await box.exec(f"cat {secret}")
    assert result.exit_code != 0
    assert "host secret" not in result.stdout


async def test_twenty_concurrent_isolated_sessions(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    boxes = await asyncio.gather(*(manager.start(spec_for(backend)) for _ in range(20)))
    shells = await asyncio.gather(*(ShellSession.open(b) for b in boxes))
    try:
        writes = await asyncio.gather(
            *(
                s.run(f"echo {i} > mine.txt && export ME={i} && cd /tmp")
                for i, s in enumerate(shells)
            )
        )
        assert all(w.exit_code == 0 for w in writes)
        reads = await asyncio.gather(
            *(s.run('cat "$OLDPWD/mine.txt"; echo $ME; ls "$OLDPWD"') for s in shells)
        )
        for i, r in enumerate(reads):
            assert r.output == f"{i}\n{i}\nmine.txt\n"
        assert len({b.workspace for b in boxes}) == 20
    finally:
        await asyncio.gather(*(s.close() for s in shells))


async def test_mounts_are_visible_read_only_at_the_same_path(
    manager: SandboxManager, backend: str, tmp_path: Path
) -> None:
    require(manager, backend)
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "tool").write_text("#!/bin/sh\necho from the mount\n")
    (env / "bin" / "tool").chmod(0o755)
    box = await manager.start(spec_for(backend, mounts=[env]))
    ran = await box.exec(f"{env}/bin/tool")
    assert ran.stdout == "from the mount\n", ran
    if backend != "local":  # the local backend isolates nothing
        wrote = await box.exec(f"touch {env}/bin/new")
        assert wrote.exit_code != 0 and not (env / "bin" / "new").exists()


async def test_a_missing_mount_is_refused(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    with pytest.raises(InvalidInputError, match="not an existing absolute directory"):
        await manager.start(spec_for(backend, mounts=[Path("/no/such/dir")]))
