"""One persistent bash per sandbox on a pseudo-terminal: no tmux, no new shell per command."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import subprocess
import termios
import time

from rollserve.errors import (
    InvalidCommandError,
    SandboxClosedError,
    SandboxDiedError,
    SandboxStartError,
    ShellBusyError,
    ShellExitedError,
)
from rollserve.sandbox import procfs
from rollserve.sandbox.base import Sandbox, TtyProcess
from rollserve.sandbox.output import HeadTail
from rollserve.schema.shell import CommandResult
from rollserve.shell import protocol

_BASH = ["bash", "--noprofile", "--norc", "--noediting", "-i"]
_WINSIZE = struct.pack("HHHH", 40, 200, 0, 0)  # rows, columns: what programs format for
_TICK_S = 0.1


class ShellSession:
    """A persistent interactive bash inside a sandbox.

    ``run`` types a command and waits for its end marker; cwd, environment, functions and
    background jobs persist between commands. A command that outlives its timeout is
    interrupted (Ctrl-C, then its process group is killed) and the session stays usable; a
    command blocked reading the terminal is reported as waiting for input, which
    ``send_input`` answers.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        tty: TtyProcess,
        *,
        workspace: str,
        input_idle_s: float,
        max_output_bytes: int,
    ) -> None:
        self.sandbox = sandbox
        self._tty = tty
        self._workspace = workspace
        self._input_idle_s = input_idle_s
        self._max_output = max_output_bytes
        self._raw = bytearray()
        self._between = HeadTail(max_output_bytes)  # output while no command ran
        self._out: HeadTail | None = None
        self._nonce: str | None = None
        self._status: int | None = None
        self._started = time.monotonic()
        self._last_data = time.monotonic()
        self._data = asyncio.Event()
        self._eof = False
        self._closed = False
        self._shell_pgrp = 0
        self._lock = asyncio.Lock()
        asyncio.get_running_loop().add_reader(tty.master_fd, self._on_readable)

    @classmethod
    async def open(
        cls,
        sandbox: Sandbox,
        *,
        startup_timeout: float = 60.0,
        input_idle_s: float = 2.0,
        max_output_bytes: int | None = None,
        env: dict[str, str] | None = None,
    ) -> ShellSession:
        """Start bash in ``sandbox`` and wait until it answers its first command."""
        tty = sandbox.spawn_tty(_BASH, env)
        fcntl.ioctl(tty.master_fd, termios.TIOCSWINSZ, _WINSIZE)
        session = cls(
            sandbox,
            tty,
            workspace=sandbox.guest_workspace,
            input_idle_s=input_idle_s,
            max_output_bytes=max_output_bytes or sandbox.limits.max_output_bytes,
        )
        try:
            await session._start(startup_timeout)
        except BaseException:
            await session.close()
            raise
        return session

    async def _start(self, timeout: float) -> None:
        nonce = protocol.new_nonce()
        self._begin(nonce)
        await self._write(protocol.init_line(self._workspace, nonce))
        deadline = time.monotonic() + timeout
        while not self._finished():
            if self._eof or self._tty.popen.poll() is not None:
                raise SandboxStartError(f"the shell exited at start: {self._early_output()}")
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"the shell did not answer within {timeout}s: {self._early_output()}"
                )
            await self._wait_data(_TICK_S)
        self._shell_pgrp = os.tcgetpgrp(self._tty.master_fd)
        self._end()

    def _early_output(self) -> str:
        text = (self._out.text(clean=True) if self._out else "") + self._raw.decode(
            errors="replace"
        )
        return text.strip()[-500:] or "(no output)"

    # -- public API ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self._closed and not self._eof and self._tty.popen.poll() is None

    @property
    def pending(self) -> bool:
        """Whether a command is still running (it returned waiting for input)."""
        return self._nonce is not None

    async def run(self, command: str, *, timeout: float | None = 120.0) -> CommandResult:
        """Run one command (any bash: pipelines, heredocs, multi-line scripts)."""
        if "\x00" in command:
            raise InvalidCommandError("command contains a NUL byte")
        async with self._lock:
            self._check_usable()
            if self._nonce is not None:
                raise ShellBusyError("a command is waiting for input: send_input or interrupt")
            nonce = protocol.new_nonce()
            self._begin(nonce)
            self._fix_echo()
            await self._write(protocol.command_lines(command, nonce))
            return await self._collect_or_abandon(timeout)

    async def send_input(self, text: str, *, timeout: float | None = 120.0) -> CommandResult:
        """Type ``text`` to the command waiting for input (include the newline)."""
        async with self._lock:
            self._check_usable()
            if self._nonce is None:
                raise ShellBusyError("no command is waiting for input")
            self._out = HeadTail(self._max_output)
            self._started = self._last_data = time.monotonic()
            await self._write(text.encode())
            return await self._collect_or_abandon(timeout)

    async def interrupt(self) -> CommandResult:
        """Interrupt the pending command (one that returned waiting for input)."""
        async with self._lock:
            self._check_usable()
            if self._nonce is None:
                raise ShellBusyError("no command is running")
            self._out = HeadTail(self._max_output)
            self._started = time.monotonic()
            await self._interrupt()
            return self._result(timed_out=False, exit_code=self._status)

    async def close(self) -> None:
        """Kill the shell and everything it started; the sandbox stays open."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._tty.master_fd)
        self.sandbox.release_tty(self._tty)

    # -- reading ---------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            while True:
                chunk = os.read(self._tty.master_fd, 65536)
                if not chunk:
                    raise OSError("eof")
                self._feed(chunk)
        except BlockingIOError:
            pass
        except OSError:  # EIO: every process holding the terminal is gone
            self._eof = True
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._tty.master_fd)
        self._data.set()

    def _feed(self, chunk: bytes) -> None:
        self._last_data = time.monotonic()
        raw = bytes(self._raw) + chunk
        self._raw.clear()
        while (m := protocol.MARKER.search(raw)) is not None:
            self._emit(raw[: m.start()])
            raw = raw[m.end() :]
            if m.group(1).decode() == self._nonce:
                self._status = int(m.group(2))
                self._nonce = None
                self._emit(raw)
                return
        keep = protocol.safe_length(raw)
        self._emit(raw[:keep])
        self._raw += raw[keep:]

    def _emit(self, data: bytes) -> None:
        if data:
            (self._out if self._out is not None and self._nonce else self._between).feed(data)

    async def _wait_data(self, seconds: float) -> None:
        self._data.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._data.wait(), seconds)

    # -- command lifecycle -----------------------------------------------------------------------

    def _begin(self, nonce: str) -> None:
        self._out = HeadTail(self._max_output)
        if self._between.head or self._between.tail:
            self._out.feed(bytes(self._between.head + self._between.tail))
            self._between = HeadTail(self._max_output)
        self._nonce = nonce
        self._status = None
        self._started = time.monotonic()
        self._last_data = self._started

    def _end(self) -> None:
        self._out = None

    def _finished(self) -> bool:
        return self._nonce is None

    def _check_usable(self) -> None:
        if self._closed:
            raise ShellExitedError("the shell session is closed")
        if self.sandbox.closed:
            raise SandboxClosedError(f"sandbox {self.sandbox.id} is closed")
        if not self.alive:
            self._raise_dead()

    def _raise_dead(self) -> None:
        if self.sandbox.closed:
            why = f": {self.sandbox.close_reason}" if self.sandbox.close_reason else ""
            raise SandboxClosedError(f"sandbox {self.sandbox.id} was closed under the command{why}")
        code = self._tty.popen.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._tty.popen.wait(timeout=1)
        if code is not None and 0 <= code < 128:
            raise ShellExitedError(f"the shell exited with status {code}", exit_code=code)
        raise SandboxDiedError(f"the sandbox's shell died (status {code})", status=code)

    async def _collect_or_abandon(self, timeout: float | None) -> CommandResult:
        try:
            return await self._collect(timeout)
        except asyncio.CancelledError:
            # The caller gave up on the command mid-way: its state is unknown, so the shell
            # and all it started are killed rather than left running unseen.
            await self.close()
            raise

    async def _collect(self, timeout: float | None) -> CommandResult:
        deadline = None if timeout is None else self._started + timeout
        while not self._finished():
            if self._eof or self._tty.popen.poll() is not None:
                # Output written just before the end may still be in the terminal.
                self._on_readable()
                if self._finished():
                    break
                self._nonce = None
                self._raise_dead()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                await self._interrupt()
                return self._result(timed_out=True, exit_code=None)
            if now - self._last_data >= self._input_idle_s and self._waiting_for_input():
                return self._result(waiting=True, exit_code=None)
            wait = _TICK_S if deadline is None else min(_TICK_S, deadline - now)
            await self._wait_data(max(wait, 0.001))
        return self._result(exit_code=self._status)

    def _waiting_for_input(self) -> bool:
        try:
            fg = os.tcgetpgrp(self._tty.master_fd)
        except OSError:
            return False
        return procfs.reading_terminal(procfs.group_members(fg), self._tty.tty_rdev)

    def _result(
        self, *, exit_code: int | None, timed_out: bool = False, waiting: bool = False
    ) -> CommandResult:
        out = self._out or HeadTail(self._max_output)
        result = CommandResult(
            output=out.text(clean=True),
            exit_code=exit_code,
            duration_s=time.monotonic() - self._started,
            timed_out=timed_out,
            truncated=out.truncated,
            waiting_for_input=waiting,
            dropped_bytes=out.dropped_bytes,
        )
        if not waiting:
            self._end()
        else:
            self._out = HeadTail(self._max_output)
        return result

    async def _interrupt(self) -> None:
        """Ctrl-C; if the foreground job ignores it, SIGKILL its process group; then resync."""
        master = self._tty.master_fd
        await self._write(b"\x03")
        if not await self._until_shell_in_foreground(1.0):
            with contextlib.suppress(OSError):
                os.killpg(os.tcgetpgrp(master), signal.SIGKILL)
            if not await self._until_shell_in_foreground(5.0):
                await self.close()
                raise ShellExitedError("the shell did not come back after an interrupt")
        termios.tcflush(master, termios.TCIFLUSH)  # what the dead command never read
        nonce = protocol.new_nonce()
        self._nonce = nonce
        await self._write(protocol.sync_line(nonce))
        deadline = time.monotonic() + 10.0
        while not self._finished():
            if self._eof or self._tty.popen.poll() is not None:
                self._nonce = None
                self._raise_dead()
            if time.monotonic() > deadline:
                await self.close()
                raise ShellExitedError("the shell did not answer after an interrupt")
            await self._wait_data(_TICK_S)

    async def _until_shell_in_foreground(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                if os.tcgetpgrp(self._tty.master_fd) == self._shell_pgrp:
                    return True
            except OSError:
                return False
            await asyncio.sleep(0.01)
        return False

    def _fix_echo(self) -> None:
        """A program killed mid-way (an editor, a pager) may leave echo on: turn it off."""
        attrs = termios.tcgetattr(self._tty.master_fd)
        if attrs[3] & termios.ECHO:
            attrs[3] &= ~termios.ECHO
            termios.tcsetattr(self._tty.master_fd, termios.TCSANOW, attrs)

    async def _write(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._tty.master_fd, view)
                view = view[n:]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(self._tty.master_fd, ready.set_result, None)
                try:
                    await asyncio.wait_for(ready, 5.0)
                finally:
                    loop.remove_writer(self._tty.master_fd)
            except OSError as exc:
                self._eof = True
                raise SandboxDiedError(f"cannot write to the shell: {exc}") from exc
