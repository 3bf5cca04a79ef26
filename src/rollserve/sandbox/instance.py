"""The one Sandbox implementation: processes started through a backend's launcher, limited by a
cgroup or rlimits, recorded in the state directory, and all destroyed on close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pty
import shlex
import signal
import subprocess
import termios
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from rollserve.errors import InvalidCommandError, SandboxClosedError, SandboxPathError
from rollserve.sandbox import procfs, state
from rollserve.sandbox.base import Launcher, TtyProcess
from rollserve.sandbox.limits import Cgroup, confine, rlimits_for
from rollserve.sandbox.output import HeadTail
from rollserve.schema.sandbox import ExecResult, SandboxLimits

log = logging.getLogger(__name__)

_READ_CHUNK = 65536


class SandboxInstance:
    """A live sandbox: see :class:`rollserve.sandbox.base.Sandbox`."""

    def __init__(
        self,
        *,
        record: state.SandboxRecord,
        launcher: Launcher,
        limits: SandboxLimits,
        workspace: Path,
        template: Path | None,
        cgroup: Cgroup | None,
        on_close: Callable[[SandboxInstance], None] | None = None,
    ) -> None:
        self.id = record.id
        self.backend = record.backend
        self.limits = limits
        self.guest_workspace = launcher.workspace
        self._record = record
        self._launcher = launcher
        self._workspace = workspace
        self._template = template
        self._cgroup = cgroup
        self._rlimits = rlimits_for(limits, cgroup)
        self._procs: dict[int, subprocess.Popen[bytes] | asyncio.subprocess.Process] = {}
        self._ticks: dict[int, int] = {}
        self._fds: set[int] = set()
        self._closed = False
        self._close_reason = ""
        self._on_close = on_close
        self._teardown: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        if limits.wall_time_s is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(limits.wall_time_s, self._expire)

    # -- state -----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str:
        """Why the sandbox closed other than by its owner ("" if it did not)."""
        return self._close_reason

    @property
    def workspace(self) -> Path:
        return self._workspace

    @property
    def cgroup(self) -> Cgroup | None:
        return self._cgroup

    def _check_open(self) -> None:
        if self._closed:
            why = f" ({self._close_reason})" if self._close_reason else ""
            raise SandboxClosedError(f"sandbox {self.id} is closed{why}", sandbox_id=self.id)

    def _expire(self) -> None:
        log.warning(
            "sandbox %s reached its wall-time limit of %ss", self.id, self.limits.wall_time_s
        )
        self._close_reason = f"wall-time limit of {self.limits.wall_time_s}s reached"
        self._begin_teardown()

    def _track(self, proc: subprocess.Popen[bytes] | asyncio.subprocess.Process) -> None:
        self._procs[proc.pid] = proc
        self._ticks[proc.pid] = self._record.add_process(proc.pid)

    def _confine(self, argv: list[str], *, take_tty: bool) -> list[str]:
        return confine(
            argv,
            self._cgroup,
            self._rlimits,
            take_tty=take_tty,
            set_pdeathsig=not self._launcher.dies_with_parent,
        )

    def _kill_process_tree(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        procfs.kill_session(pid, self._ticks.get(pid, 0))

    def host_processes(self) -> list[procfs.ProcStat]:
        """Every live host process of this sandbox: those it spawned, their descendants and
        sessions, and whatever is in its cgroup."""
        found = {st.pid: st for st in procfs.family(dict(self._record.processes()))}
        if self._cgroup is not None:
            for pid in self._cgroup.pids():
                st = procfs.stat(pid)
                if st is not None:
                    found.setdefault(pid, st)
        return list(found.values())

    def process_died_of_limit(self) -> bool:
        """Whether the memory limit killed a process (cgroup hosts only)."""
        return self._cgroup is not None and self._cgroup.oom_killed()

    # -- processes -------------------------------------------------------------------------------

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        started = time.monotonic()
        code, out, err = await self._run(
            argv,
            timeout=timeout,
            stdin=stdin,
            limit=max_output_bytes or self.limits.max_output_bytes,
        )
        return ExecResult(
            exit_code=code,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - started,
            timed_out=code is None,
        )

    async def _run(
        self, argv: list[str], *, timeout: float | None, stdin: bytes | None, limit: int
    ) -> tuple[int | None, HeadTail, HeadTail]:
        """Run to completion; the exit code is None after a timeout, 128+N for signal N."""
        self._check_open()
        _check_argv(argv)
        proc = await asyncio.create_subprocess_exec(
            *self._confine(self._launcher.argv(argv), take_tty=False),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._launcher.env,
            cwd=self._launcher.cwd,
            start_new_session=True,
        )
        self._track(proc)
        out, err = HeadTail(limit), HeadTail(limit)
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(
                    _pump(proc.stdout, out),
                    _pump(proc.stderr, err),
                    _feed(proc.stdin, stdin),
                    proc.wait(),
                )
        except TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None:
                self._kill_process_tree(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            self._procs.pop(proc.pid, None)
        self._check_open()  # closed underneath the process: not the command's own failure
        code = proc.returncode
        if timed_out or code is None:
            return None, out, err
        return (128 - code if code < 0 else code), out, err

    def spawn_tty(self, argv: Sequence[str], env: dict[str, str] | None = None) -> TtyProcess:
        self._check_open()
        _check_argv(list(argv))
        master, slave = pty.openpty()
        try:
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.ONLCR  # keep "\n" as "\n"
            attrs[3] &= ~(termios.ECHO | termios.ECHONL)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            rdev = os.fstat(slave).st_rdev
            take_tty = not self._launcher.tty_inside
            # setsid -c makes the new session itself; a process group leader would have to
            # fork for it, so the wrapper starts in ours and leaves it at once.
            popen = subprocess.Popen(
                self._confine(self._launcher.argv(argv, tty=True), take_tty=take_tty),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env={**self._launcher.env, **(env or {})},
                cwd=self._launcher.cwd,
                start_new_session=not take_tty,
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self._track(popen)
        self._fds.add(master)
        return TtyProcess(popen=popen, master_fd=master, tty_rdev=rdev)

    def release_tty(self, tty: TtyProcess) -> None:
        """Kill a terminal process and close its terminal (a shell session's close)."""
        self._kill_process_tree(tty.popen.pid)
        with contextlib.suppress(ProcessLookupError):
            tty.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            tty.popen.wait(timeout=5)
        self._procs.pop(tty.popen.pid, None)
        if tty.master_fd in self._fds:
            self._fds.discard(tty.master_fd)
            os.close(tty.master_fd)

    # -- files -----------------------------------------------------------------------------------

    def _host_path(self, path: str) -> Path | None:
        """The host path of a guest path, if it is inside the workspace and stays there once
        symlinks are resolved on the host; None means "go through the sandbox"."""
        guest = PurePosixPath(self._launcher.workspace) / path
        try:
            rel = guest.relative_to(self._launcher.workspace)
        except ValueError:
            return None
        host = (self._workspace / rel).resolve()
        root = self._workspace.resolve()
        return host if host == root or root in host.parents else None

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        host = self._host_path(path)
        if host is not None:
            try:
                return await asyncio.to_thread(host.read_bytes)
            except OSError as exc:
                raise SandboxPathError(f"cannot read {path}: {exc.strerror}", path=path) from exc
        size = (self.limits.max_file_size_mb or 1024) * 1024 * 1024
        code, out, err = await self._run(
            ["cat", "--", path], timeout=None, stdin=None, limit=size * 2
        )
        if code != 0:
            raise SandboxPathError(f"cannot read {path}: {err.text().strip()}", path=path)
        return bytes(out.head + out.tail)

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        host = self._host_path(path)
        if host is not None:
            try:
                await asyncio.to_thread(_write_host, host, data)
                return
            except OSError as exc:
                raise SandboxPathError(f"cannot write {path}: {exc.strerror}", path=path) from exc
        quoted = shlex.quote(path)
        result = await self.exec(
            f'mkdir -p -- "$(dirname -- {quoted})" && cat > {quoted}', stdin=data
        )
        if result.exit_code != 0:
            raise SandboxPathError(f"cannot write {path}: {result.stderr.strip()}", path=path)

    async def diff(self) -> str:
        self._check_open()
        if (self._workspace / ".git").exists():
            # A throw-away index, so the agent's own staging is left as it was; inside the
            # sandbox, because a repository's config may run programs.
            script = (
                'idx=$(mktemp) && cp .git/index "$idx" 2>/dev/null; '
                'GIT_INDEX_FILE="$idx" git add -A && '
                'GIT_INDEX_FILE="$idx" git diff --cached --binary; rc=$?; rm -f "$idx"; '
                "exit $rc"
            )
            result = await self.exec(script, max_output_bytes=256 * 1024 * 1024)
            if result.exit_code != 0:
                raise SandboxPathError(f"git diff failed: {result.stderr.strip()}")
            return result.stdout
        return await asyncio.to_thread(
            _tree_diff, self._template, self._workspace, self._record.path
        )

    # -- teardown --------------------------------------------------------------------------------

    def _begin_teardown(self) -> asyncio.Future[None]:
        """Mark the sandbox closed and kill its processes now (synchronous: safe from a timer
        callback); the slower part — reaping, cgroup and directory removal — runs after."""
        if self._teardown is not None:
            return self._teardown
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for pid, proc in list(self._procs.items()):
            self._kill_process_tree(pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        loop = asyncio.get_running_loop()
        for fd in self._fds:  # a shell session may still watch it: unhook before closing
            loop.remove_reader(fd)
            loop.remove_writer(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._teardown = asyncio.ensure_future(self._finish_teardown())
        return self._teardown

    async def _finish_teardown(self) -> None:
        procs = list(self._procs.values())
        self._procs.clear()
        for proc in procs:
            if isinstance(proc, asyncio.subprocess.Process):
                await proc.wait()
        popens = [p for p in procs if isinstance(p, subprocess.Popen)]
        await asyncio.to_thread(self._reap_and_destroy, popens)
        if self._on_close is not None:
            self._on_close(self)

    def _reap_and_destroy(self, popens: list[subprocess.Popen[bytes]]) -> None:
        for popen in popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5)
        state.destroy(self._record)

    async def close(self) -> None:
        # Shielded: a caller cancelled mid-close must not leave the sandbox half removed.
        await asyncio.shield(self._begin_teardown())


def _check_argv(argv: list[str]) -> None:
    if not argv:
        raise InvalidCommandError("empty command")
    for arg in argv:
        if "\x00" in arg:
            raise InvalidCommandError("command contains a NUL byte", argument=arg[:80])


async def _pump(stream: asyncio.StreamReader | None, sink: HeadTail) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        sink.feed(chunk)


async def _feed(stream: asyncio.StreamWriter | None, data: bytes | None) -> None:
    if stream is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            stream.write(data)
            await stream.drain()
        stream.close()


def _write_host(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _tree_diff(template: Path | None, workspace: Path, scratch: Path) -> str:
    """``diff -ruN`` of template and workspace with ``a/`` and ``b/`` paths."""
    base = scratch / "diff"
    base.mkdir(exist_ok=True)
    a, b = base / "a", base / "b"
    empty = base / "empty"
    empty.mkdir(exist_ok=True)
    for link, target in ((a, template or empty), (b, workspace)):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target.resolve())
    proc = subprocess.run(
        ["diff", "-ruN", "--no-dereference", "a/", "b/"], cwd=base, capture_output=True, check=False
    )
    if proc.returncode > 1:
        raise SandboxPathError(f"diff failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode("utf-8", errors="replace")
