"""Races and hostile sandboxes: what a sandbox process or an unlucky caller can do must neither
leak nor reach the host."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path

import pytest

from rollserve.errors import SandboxClosedError, SandboxPathError
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.schema.sandbox import SandboxLimits
from rollserve.shell import ShellSession
from tests.conformance.conftest import require
from tests.leaks import sandbox_processes
from tests.repos import git_repo


async def test_symlink_never_leads_file_access_out(
    manager: SandboxManager, isolating_backend: str, tmp_path: Path
) -> None:
    require(manager, isolating_backend)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    box = await manager.start(spec_for(isolating_backend))
    (box.workspace / "evil").symlink_to(outside)
    (box.workspace / "evil-file").symlink_to(outside / "secret")
    for path in ("evil/planted", "evil-file"):
        with contextlib.suppress(SandboxPathError):  # refused, or written inside the sandbox
            await box.write_file(path, b"from the sandbox")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "host secret"
    with pytest.raises(SandboxPathError):
        await box.read_file("evil/secret")


async def test_file_access_refuses_fifos_and_huge_files(
    manager: SandboxManager, backend: str
) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend, limits=SandboxLimits(max_file_size_mb=1)))
    await box.exec("mkfifo pipe && head -c 3000000 /dev/zero > big; true")
    with pytest.raises(SandboxPathError, match="regular file"):
        await asyncio.wait_for(box.read_file("pipe"), 10)
    with pytest.raises(SandboxPathError, match="larger than"):
        await box.read_file("/dev/zero")


async def test_exec_racing_close_leaves_nothing(manager: SandboxManager, backend: str) -> None:
    require(manager, backend)
    box = await manager.start(spec_for(backend))
    runs = [asyncio.create_task(box.exec("sleep 77")) for _ in range(3)]
    await asyncio.sleep(0)  # the spawns are in flight
    await manager.close(box)
    for run in runs:
        with pytest.raises(SandboxClosedError):
            await run
    out = subprocess.run(["pgrep", "-f", "sleep 77"], capture_output=True, text=True)
    assert out.stdout == ""
    assert not box.workspace.parent.exists()


async def test_cancelled_start_leaves_nothing(manager: SandboxManager, tmp_path: Path) -> None:
    template = tmp_path / "big"
    template.mkdir()
    for i in range(2000):
        (template / f"f{i}").write_bytes(b"x" * 4096)
    start = asyncio.create_task(manager.start(spec_for("local", template=template)))
    await asyncio.sleep(0.02)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert list(manager.settings.state_dir.iterdir()) == []


async def test_session_outliving_its_sandbox_harms_no_other(
    manager: SandboxManager, backend: str
) -> None:
    require(manager, backend)
    first = await manager.start(spec_for(backend))
    stale = await ShellSession.open(first)
    await manager.close(first)
    second = await manager.start(spec_for(backend))
    fresh = await ShellSession.open(second)  # may reuse the closed terminal's fd number
    with pytest.raises(SandboxClosedError):
        await stale.run("echo hi")
    await stale.close()
    result = await fresh.run("echo hi")
    assert (result.output, result.exit_code) == ("hi\n", 0)


async def test_interrupting_a_builtin(shell: ShellSession) -> None:
    waiting = await shell.run("read x; echo after")
    assert waiting.waiting_for_input
    stopped = await asyncio.wait_for(shell.interrupt(), 8)
    assert not stopped.waiting_for_input
    loop = await asyncio.wait_for(shell.run("i=0; while :; do i=$((i + 1)); done", timeout=1), 12)
    assert loop.timed_out
    assert (await shell.run("echo ok")).output == "ok\n"


async def test_unread_input_never_runs(shell: ShellSession) -> None:
    waiting = await shell.run("read x; echo got $x")
    assert waiting.waiting_for_input
    answered = await shell.send_input("A\n: > /tmp/leaked\ntouch /tmp/leaked2; echo 'open quote\n")
    assert answered.output == "got A\n"
    after = await shell.run("echo ok; ls /tmp/leaked /tmp/leaked2 2>&1 | grep -c 'No such'")
    assert after.output == "ok\n2\n"


async def test_input_nobody_reads_times_out(shell: ShellSession) -> None:
    waiting = await shell.run("read x; sleep 100")
    assert waiting.waiting_for_input
    flood = "y" * 2000 + "\n"
    result = await asyncio.wait_for(shell.send_input(flood * 10, timeout=2), 15)
    assert result.timed_out
    assert (await shell.run("echo ok")).output == "ok\n"


async def test_busy_programs_are_not_waiting_for_input(shell: ShellSession) -> None:
    for program in (
        "import asyncio; asyncio.run(asyncio.sleep(2.5)); print('done')",
        "import os, select; r, w = os.pipe(); select.select([r], [], [], 2.5); print('done')",
        "import os, select; r, w = os.pipe(); p = select.poll(); p.register(r); "
        "p.poll(2500); print('done')",
    ):
        result = await shell.run(f'python3 -c "{program}"', timeout=30)
        assert not result.waiting_for_input, program
        assert (result.output, result.exit_code) == ("done\n", 0), program


async def test_output_of_a_command_that_ends_after_waiting_is_kept(shell: ShellSession) -> None:
    waiting = await shell.run("read -t 3 x; echo late")
    assert waiting.waiting_for_input
    await asyncio.sleep(3.5)
    assert not shell.pending
    result = await shell.run("echo next")
    assert result.output == "late\nnext\n"


async def test_poll_based_reader_is_waiting(shell: ShellSession) -> None:
    result = await shell.run(
        "python3 -c 'import select, sys; select.select([sys.stdin], [], []); "
        'print("read", sys.stdin.readline().strip())\'',
        timeout=20,
    )
    assert result.waiting_for_input
    answered = await shell.send_input("line\n")
    assert answered.output == "read line\n"


async def test_session_environment(sandbox: SandboxInstance) -> None:
    session = await ShellSession.open(sandbox, env={"TASK_ID": "t-1", "QUOTED": "a 'b' $c"})
    result = await session.run('echo "$TASK_ID|$QUOTED"')
    assert result.output == "t-1|a 'b' $c\n"
    await session.close()


async def test_diff_keeps_bytes_and_symlinks(
    manager: SandboxManager, backend: str, tmp_path: Path
) -> None:
    require(manager, backend)
    repo = git_repo(tmp_path / "repo", {"latin.txt": b"caf\xe9\n"})
    box = await manager.start(spec_for(backend, template=repo))
    await box.exec("printf 'th\\xe9\\n' >> latin.txt && ln -s latin.txt link")
    patch = (await box.diff()).encode("utf-8", errors="surrogateescape")
    applied = subprocess.run(
        ["git", "apply", "--check", "-"], cwd=repo, input=patch, capture_output=True, check=False
    )
    assert applied.returncode == 0, applied.stderr
    plain = await manager.start(spec_for(backend))
    await plain.exec("echo x > f && ln -s f link")
    assert "new file mode 120000" in await plain.diff()
    procs = sandbox_processes(box)
    await manager.close(box)
    assert not [p for p in procs if p.alive()]


async def test_failed_terminal_spawn_leaves_a_closable_sandbox(
    manager: SandboxManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pty

    box = await manager.start(spec_for("local"))

    def no_pty() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(pty, "openpty", no_pty)
    with pytest.raises(OSError, match="Too many"):
        await ShellSession.open(box)
    monkeypatch.undo()
    await asyncio.wait_for(manager.close(box), 10)
    assert not box.workspace.parent.exists()
