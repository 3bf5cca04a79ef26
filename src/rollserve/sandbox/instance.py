"""The one Sandbox implementation: processes started through a backend's launcher, limited by a
cgroup or rlimits, recorded in the state directory, and all destroyed on close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pty
import resource
import shlex
import subprocess
import termios
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rollserve.errors import (
    InfrastructureError,
    InvalidInputError,
    SandboxClosedError,
    SandboxDiedError,
    SandboxPathError,
)
from rollserve.sandbox import files, procfs, spawned, state
from rollserve.sandbox.base import Launcher, TtyProcess
from rollserve.sandbox.limits import Cgroup, confine, enforcement, prlimit_args, rlimits_for
from rollserve.sandbox.output import HeadTail
from rollserve.sandbox.workspace import Layout, keep_layer
from rollserve.schema.sandbox import ExecResult, LimitCheck, SandboxLimits

log = logging.getLogger(__name__)

_FILE_OP_TIMEOUT_S = 120.0
_DRAIN_S = 10.0  # reading what a killed command left in its pipes
_DIFF_LIMIT = 256 * 1024 * 1024
# A throw-away index, so the agent's own staging is left as it was; run inside the sandbox,
# because a repository's own configuration may run programs.
_GIT_DIFF = (
    'idx=$(mktemp) && rm -f "$idx" && { cp .git/index "$idx" 2>/dev/null; true; } && '
    'GIT_INDEX_FILE="$idx" git add -A && GIT_INDEX_FILE="$idx" git diff --cached --binary '
    '--no-color --no-ext-diff --no-textconv; rc=$?; rm -f "$idx"; exit $rc'
)


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
        unenforced: dict[str, str] | None = None,
        run_dir: Path | None = None,
        layout: Layout | None = None,
    ) -> None:
        self.id = record.id
        self.backend = record.backend
        self.limits = limits
        # The limits asked for that this host does not enforce, each with the reason.
        self.unenforced = dict(unenforced or {})
        self.guest_workspace = launcher.workspace
        self.run_dir = run_dir  # the host side of /run/rollserve, where the spec asked for it
        self._record = record
        self._launcher = launcher
        layout = layout or Layout("bind")
        self.workspace_mode = layout.how  # bind, copy or overlay
        self._holder = layout.holder
        self._upper = layout.upper  # what a writable root's sandbox wrote
        self.has_layer = self._upper is not None  # a layer it can keep when it closes
        self._keep: Path | None = None  # where that goes when it closes
        self._kept: str | None = None  # why keeping it failed
        # rollserve's own way to the workspace: through the holder where the mounts are its
        self._workspace = workspace if self._holder is None else self._holder.host_path(workspace)
        self._template = template
        self._cgroup = cgroup
        rlimits = rlimits_for(limits, cgroup)
        # Set inside the sandbox: the address-space limit where the wrapper itself cannot run
        # under it (Apptainer's Go runtime reserves about 1 GB of address space at start), and
        # the process limit wherever the sandbox has a user namespace of its own — there it
        # counts the sandbox's processes only, where outside it would count every process of
        # rollserve's user (all the other sandboxes of a rootless node).
        inner = {resource.RLIMIT_NPROC} if launcher.contained else set()
        if launcher.address_space_inside:
            inner.add(resource.RLIMIT_AS)
        self._inner_rlimits = [r for r in rlimits if r[0] in inner]
        self._rlimits = [r for r in rlimits if r not in self._inner_rlimits]
        self._procs: dict[int, spawned.Proc] = {}
        self._ticks: dict[int, int] = {}
        if self._holder is not None:  # killed and reaped with the sandbox's processes
            self._procs[self._holder.pid] = self._holder.proc
        self._ttys: list[TtyProcess] = []
        self._spawning = 0
        self._spawns_done = asyncio.Event()
        self._spawns_done.set()
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

    def limit_events(self) -> dict[str, int]:
        """How often the sandbox hit its limits (``max_processes``: forks refused,
        ``memory_mb``: processes killed), as its cgroup counted them; empty without one
        (rlimits count nothing: the process that hit one sees EAGAIN or ENOMEM itself)."""
        return self._cgroup.limit_events() if self._cgroup is not None else {}

    def enforcement(self) -> dict[str, LimitCheck]:
        """How each of the sandbox's limits is enforced, or why it is not."""
        return enforcement(
            self.limits, self._cgroup, self.unenforced, contained=self._launcher.contained
        )

    @property
    def closes_by(self) -> str:
        """How a close finds every process of the sandbox."""
        if self._launcher.contained:
            return "PID namespaces: killing each wrapper ends all it started"
        if self._cgroup is not None:
            return "its cgroup"
        return "a scan of /proc for its processes' sessions"

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

    # -- spawning --------------------------------------------------------------------------------

    def _confine(self, argv: list[str], *, take_tty: bool) -> list[str]:
        """The host command line that runs ``argv`` (already wrapped by the launcher)."""
        if self._holder is not None:
            argv = [*self._holder.enter(), *argv]
        return confine(
            argv,
            self._cgroup,
            self._rlimits,
            take_tty=take_tty,
            set_pdeathsig=not self._launcher.dies_with_parent,
        )

    def _inside(self, argv: list[str]) -> list[str]:
        if not self._inner_rlimits:
            return argv
        return ["prlimit", *prlimit_args(self._inner_rlimits), "--", *argv]

    def _enter_spawn(self) -> None:
        self._check_open()
        self._spawning += 1
        self._spawns_done.clear()

    def _leave_spawn(self, proc: spawned.Proc | None) -> None:
        """Record a new process — or, if the sandbox was closed while it was being spawned,
        kill it (the teardown waits for every spawn in flight before removing anything)."""
        self._spawning -= 1
        if self._spawning == 0:
            self._spawns_done.set()
        if proc is None:
            return
        if self._closed:
            self._ticks[proc.pid] = procfs.start_ticks(proc.pid) or 0
            spawned.kill_unreaped(proc)
            return
        self._procs[proc.pid] = proc
        self._ticks[proc.pid] = self._record.add_process(proc.pid)

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
            truncated=out.truncated or err.truncated,
        )

    async def _run(
        self, argv: list[str], *, timeout: float | None, stdin: bytes | None, limit: int
    ) -> tuple[int | None, HeadTail, HeadTail]:
        """Run to completion; the exit code is None after a timeout, 128+N for signal N."""
        spawned.check_argv(argv)
        self._enter_spawn()
        proc = None
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._confine(self._launcher.argv(self._inside(argv)), take_tty=False),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._launcher.env,
                cwd=self._launcher.cwd,
                start_new_session=True,
            )
        finally:
            self._leave_spawn(proc)
        out, err = HeadTail(limit), HeadTail(limit)
        timed_out = False
        try:
            self._check_open()
            async with asyncio.timeout(timeout):
                await asyncio.gather(
                    spawned.pump(proc.stdout, out),
                    spawned.pump(proc.stderr, err),
                    spawned.feed(proc.stdin, stdin),
                    proc.wait(),
                )
        except TimeoutError:
            timed_out = True
        finally:
            killed = proc.returncode is None
            if killed:
                spawned.kill_unreaped(proc)
                # What the killed command wrote still fills its pipes: read them to the end,
                # or the transport never finishes and wait() never returns.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_DRAIN_S):
                        await asyncio.gather(
                            spawned.pump(proc.stdout, out), spawned.pump(proc.stderr, err)
                        )
                await proc.wait()
            self._procs.pop(proc.pid, None)
            await self._retire(proc.pid, kill=killed)
        self._check_open()  # closed underneath the process: not the command's own failure
        code = proc.returncode
        if timed_out or code is None:
            return None, out, err
        if code < 0 and self._launcher.signal_as_status:
            # The wrapper itself died of a signal rollserve did not send: the sandbox was
            # killed underneath the command, which must not be scored as the command's end.
            raise SandboxDiedError(
                f"sandbox {self.id} was killed by signal {-code} during a command",
                sandbox_id=self.id,
                signal=-code,
            )
        return (128 - code if code < 0 else code), out, err

    async def spawn_tty(self, argv: Sequence[str], env: dict[str, str] | None = None) -> TtyProcess:
        spawned.check_argv(list(argv))
        self._enter_spawn()
        # A thread forks it: a fork costs the loop milliseconds with hundreds of sandboxes.
        loop = asyncio.get_running_loop()
        opened = loop.run_in_executor(None, self._open_tty, list(argv), env)
        tty: TtyProcess | None = None
        try:
            tty = await asyncio.shield(opened)
        except asyncio.CancelledError:
            if not opened.cancelled():  # it started anyway: record it, so close kills it
                try:
                    tty = await opened
                except Exception as exc:  # it did not start: nothing to kill
                    log.debug("a cancelled shell start failed: %s", exc)
            raise
        finally:
            self._leave_spawn(tty.popen if tty is not None else None)
            if tty is not None:
                self._ttys.append(tty)
        return tty

    def _open_tty(self, argv: list[str], env: dict[str, str] | None) -> TtyProcess:
        self._check_open()
        master, slave = pty.openpty()
        try:
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.ONLCR  # keep "\n" as "\n"
            attrs[3] &= ~(termios.ECHO | termios.ECHONL)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            rdev = os.fstat(slave).st_rdev
            path = os.ttyname(slave)
            take_tty = not self._launcher.tty_inside
            # setsid -c makes the new session itself; a process group leader would have to
            # fork for it, so the wrapper starts in ours and leaves it at once.
            popen = subprocess.Popen(
                self._confine(self._launcher.argv(self._inside(argv), tty=True), take_tty=take_tty),
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
        return TtyProcess(popen=popen, master_fd=master, tty_rdev=rdev, tty_path=path)

    async def release_tty(self, tty: TtyProcess) -> None:
        """Kill a terminal process and everything it started, and close its terminal."""
        spawned.kill_unreaped(tty.popen)
        spawned.close_tty(tty)
        if tty in self._ttys:
            self._ttys.remove(tty)
        pid = tty.popen.pid
        # The session is killed while its leader is still unreaped, so its id is still ours.
        await asyncio.to_thread(self._kill_session, pid)
        await asyncio.to_thread(spawned.reap, [tty.popen])
        self._procs.pop(pid, None)
        self._retire_record(pid, [])

    async def _retire(self, pid: int, *, kill: bool) -> None:
        """After a leader was reaped: kill what is left of its session, or (a command that
        ended by itself may leave background processes) note those processes one by one."""
        if kill:
            await asyncio.to_thread(self._kill_session, pid)
            members: list[tuple[int, int]] = []
        else:
            members = await asyncio.to_thread(self._session_members, pid)
        self._retire_record(pid, members)

    def _kill_session(self, leader: int) -> None:
        if not self._launcher.contained:  # else its PID namespace went with the leader
            procfs.kill_sessions({leader: self._ticks.get(leader, 0)}, self._own())

    def _session_members(self, leader: int) -> list[tuple[int, int]]:
        if self._launcher.contained:
            return []
        return procfs.session_members(leader, self._ticks.get(leader, 0), self._own())

    def _own(self) -> set[int] | None:
        """Where this sandbox's processes are: its cgroup (every process joins it before it
        runs anything), or anywhere on the host without one."""
        return self._cgroup.pids() if self._cgroup is not None else None

    def _retire_record(self, pid: int, members: list[tuple[int, int]]) -> None:
        if not self._closed:  # once closed, the teardown owns (and removes) the record
            self._record.retire(pid, self._ticks.get(pid, 0), members)

    # -- files -----------------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        limit = (self.limits.max_file_size_mb or 1024) * 1024 * 1024
        rel = files.workspace_relative(self.guest_workspace, path)
        if rel is not None:
            with contextlib.suppress(files.SymlinkInPath):
                return await asyncio.to_thread(files.read_beneath, self._workspace, rel, limit)
        code, out, err = await self._run(
            ["head", "-c", str(limit + 1), "--", path],
            timeout=_FILE_OP_TIMEOUT_S,
            stdin=None,
            limit=limit + 2,
        )
        if code != 0:
            raise SandboxPathError(f"cannot read {path}: {err.text().strip()}", path=path)
        data = bytes(out.head + out.tail)
        if len(data) > limit:
            raise SandboxPathError(f"{path} is larger than {limit} bytes", path=path)
        return data

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        rel = files.workspace_relative(self.guest_workspace, path)
        if rel is not None:
            with contextlib.suppress(files.SymlinkInPath):
                await asyncio.to_thread(files.write_beneath, self._workspace, rel, data)
                return
        quoted = shlex.quote(path)
        result = await self.exec(
            f'mkdir -p -- "$(dirname -- {quoted})" && cat > {quoted}',
            stdin=data,
            timeout=_FILE_OP_TIMEOUT_S,
        )
        if result.exit_code != 0:
            raise SandboxPathError(f"cannot write {path}: {result.stderr.strip()}", path=path)

    async def diff(self) -> str:
        self._check_open()
        if not (self._workspace / ".git").exists():
            return await asyncio.to_thread(
                files.tree_diff, self._template, self._workspace, self._record.path, _DIFF_LIMIT
            )
        code, out, err = await self._run(
            ["bash", "-c", _GIT_DIFF], timeout=_FILE_OP_TIMEOUT_S, stdin=None, limit=_DIFF_LIMIT
        )
        if code != 0:
            raise SandboxPathError(f"git diff failed: {err.text().strip()}")
        if out.truncated:
            raise SandboxPathError(f"the workspace diff is larger than {_DIFF_LIMIT} bytes")
        return bytes(out.head + out.tail).decode("utf-8", errors="surrogateescape")

    # -- teardown --------------------------------------------------------------------------------

    def _begin_teardown(self) -> asyncio.Future[None]:
        """Mark the sandbox closed and kill its processes now (synchronous: safe from a timer
        callback); reaping and removing cgroup, mounts and files follow off the event loop."""
        if self._teardown is not None:
            return self._teardown
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for proc in self._procs.values():
            spawned.kill_unreaped(proc)
        for tty in self._ttys:
            spawned.close_tty(tty)
        self._ttys.clear()
        self._teardown = asyncio.ensure_future(self._finish_teardown())
        return self._teardown

    async def _finish_teardown(self) -> None:
        try:
            await self._spawns_done.wait()
            procs = list(self._procs.values())
            self._procs.clear()
            for proc in procs:
                if isinstance(proc, asyncio.subprocess.Process):
                    await proc.wait()
            if self._keep is not None and self._upper is not None:
                self._kept = await keep_layer(self._upper, self._keep)
            # Terminal leaders are reaped only after destroy() killed their sessions: while
            # they are unreaped, their PIDs (the session ids) cannot name anything else.
            complete = await asyncio.to_thread(state.destroy, self._record)
            await asyncio.to_thread(
                spawned.reap, [p for p in procs if isinstance(p, subprocess.Popen)]
            )
            if not complete:
                log.error("sandbox %s was not removed completely; the next start retries", self.id)
        finally:
            if self._on_close is not None:
                self._on_close(self)

    async def close(self) -> None:
        # Shielded: a caller cancelled mid-close must not leave the sandbox half removed.
        await asyncio.shield(self._begin_teardown())

    async def close_keeping_layer(self, dest: Path) -> None:
        """Close the sandbox, its writable root's layer (what it wrote anywhere) moved to
        ``dest`` first, for a later sandbox's ``lower_layers``; InfrastructureError if not."""
        if self._upper is None:
            raise InvalidInputError(f"sandbox {self.id} has no layer to keep (no overlay)")
        if self._teardown is not None:
            raise InfrastructureError(f"sandbox {self.id} closed before its layer was kept")
        self._keep = dest
        await self.close()
        if self._kept is not None:
            raise InfrastructureError(f"keeping the layer of sandbox {self.id}: {self._kept}")
