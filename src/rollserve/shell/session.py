"""One persistent bash per sandbox on a pseudo-terminal: no tmux, no new shell per command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections import deque
from collections.abc import Awaitable

from rollserve.errors import (
    InvalidCommandError,
    InvalidInputError,
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
from rollserve.shell.terminal import Terminal

_BASH = ["bash", "--noprofile", "--norc", "--noediting", "-i"]
_TICK_S = 0.1
_RESYNC_EVERY_S = 0.3
_RESYNC_LIMIT_S = 10.0
_GROUP_SCAN_EVERY_S = 1.0
_MAX_INPUT_LINE = 4095  # the terminal's canonical-mode line limit
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REMEMBERED_NONCES = 64  # markers of this many recent commands and resyncs are recognised


class ShellSession:
    """A persistent interactive bash inside a sandbox.

    ``run`` types a command and waits for its end marker; cwd, environment, functions and
    background jobs persist between commands. A command that outlives its timeout is
    interrupted (Ctrl-C, then its process group is killed) and the session stays usable; a
    command blocked reading the terminal is reported as waiting for input, which
    ``send_input`` answers (input the command leaves unread is discarded, never run by the
    shell) or ``interrupt`` stops. A caller that cancels a command closes the session: what the
    command was doing is unknown. A command that ends the shell itself (``exit``, ``exec``, a
    failure under ``set -e``) raises ShellExitedError, as a terminal would close; open a new
    session then. Results come from the shell's own report: whatever runs in the sandbox could
    forge them, so rewards are never computed from them.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        tty: TtyProcess,
        *,
        input_idle_s: float,
        max_output_bytes: int,
    ) -> None:
        self.sandbox = sandbox
        self._input_idle_s = input_idle_s
        self._max_output = max_output_bytes
        self._raw = b""
        self._between = HeadTail(max_output_bytes)  # output while no command ran
        self._out = HeadTail(max_output_bytes)
        self._nonce: str | None = None
        self._issued: deque[str] = deque(maxlen=_REMEMBERED_NONCES)
        self._status: int | None = None
        self._started = time.monotonic()
        self._fed_input = False
        self._closed = False
        self._shell_pgrp = 0
        self._next_group_scan = 0.0
        self._lock = asyncio.Lock()
        self._term = Terminal(tty, self._feed)

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
        for name in env or {}:
            if not _ENV_NAME.fullmatch(name):
                raise InvalidInputError(f"invalid environment variable name {name!r}")
        session = cls(
            sandbox,
            await sandbox.spawn_tty(_BASH),
            input_idle_s=input_idle_s,
            max_output_bytes=max_output_bytes or sandbox.limits.max_output_bytes,
        )
        try:
            await session._start(startup_timeout)
            if env:  # sandboxes start from a clean environment: set these in the shell itself
                await session.run(protocol.exports(env))
        except BaseException:
            await session.close()
            raise
        return session

    async def _start(self, timeout: float) -> None:
        nonce = self._begin()
        await self._term.write(protocol.init_line(self.sandbox.guest_workspace, nonce))
        deadline = time.monotonic() + timeout
        while not self._finished():
            if self._term.gone:
                raise SandboxStartError(f"the shell exited at start: {self._early_output()}")
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"the shell did not answer within {timeout}s: {self._early_output()}"
                )
            await self._term.wait(_TICK_S)
        self._shell_pgrp = self._term.foreground() or 0
        self._out = HeadTail(self._max_output)  # the shell's first prompt and the like

    def _early_output(self) -> str:
        text = self._out.text(clean=True) + self._raw.decode(errors="replace")
        return text.strip()[-500:] or "(no output)"

    # -- public API ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self._closed and not self._term.gone

    @property
    def pending(self) -> bool:
        """Whether a command is still running (it returned waiting for input)."""
        return self._nonce is not None

    async def run(self, command: str, *, timeout: float | None = 120.0) -> CommandResult:
        """Run one command (any bash: pipelines, heredocs, multi-line scripts)."""
        if "\x00" in command:
            raise InvalidCommandError("command contains a NUL byte")
        if (bad := protocol.lone_surrogate(command)) is not None:
            raise InvalidCommandError(
                f"command contains the lone surrogate {bad!r} (not a character of any encoding)"
            )
        async with self._lock:
            await self._check_usable()
            if self._nonce is not None:
                raise ShellBusyError("a command is waiting for input: send_input or interrupt")
            nonce = self._begin()
            self._term.echo_off()
            return await self._guard(
                self._type_and_collect(protocol.command_lines(command, nonce), timeout)
            )

    async def send_input(self, text: str, *, timeout: float | None = 120.0) -> CommandResult:
        """Type ``text`` to the command waiting for input (include the newline)."""
        if (bad := protocol.lone_surrogate(text)) is not None:
            raise InvalidCommandError(f"input contains the lone surrogate {bad!r}")
        data = text.encode("utf-8", errors="surrogateescape")
        if b"\x00" in data or any(len(line) > _MAX_INPUT_LINE for line in data.split(b"\n")):
            raise InvalidCommandError(
                f"input lines must be under {_MAX_INPUT_LINE + 1} bytes and hold no NUL byte"
            )
        async with self._lock:
            await self._check_usable()
            if self._nonce is None:
                raise ShellBusyError("no command is waiting for input")
            self._started = self._term.last_data = time.monotonic()
            self._fed_input = True
            return await self._guard(self._type_and_collect(data, timeout))

    async def interrupt(self) -> CommandResult:
        """Interrupt the pending command (one that returned waiting for input)."""
        async with self._lock:
            await self._check_usable()
            if self._nonce is None:
                raise ShellBusyError("no command is running")
            self._started = time.monotonic()
            return await self._guard(self._interrupted())

    async def close(self) -> None:
        """Kill the shell and everything it started; the sandbox stays open."""
        if self._closed:
            return
        self._closed = True
        self._term.detach()
        # Shielded: a second cancellation must not stop the kill half-way.
        await asyncio.shield(self.sandbox.release_tty(self._term.tty))

    # -- output ----------------------------------------------------------------------------------

    def _feed(self, chunk: bytes) -> None:
        """Split terminal output into command output and end markers. Only markers carrying a
        nonce this session issued count (those of commands given up on are dropped, only the
        awaited one ends the command); anything else shaped like a marker is output, and is
        searched from its next byte on, since its tail may be the start of a real marker."""
        raw = self._raw + chunk
        at = 0
        while (m := protocol.MARKER.search(raw, at)) is not None:
            nonce = m.group(1).decode()
            if nonce not in self._issued:
                at = m.start() + 1
                continue
            self._emit(raw[: m.start()])
            raw = raw[m.end() :]
            at = 0
            if nonce == self._nonce:
                self._status = int(m.group(2))
                self._nonce = None
        keep = protocol.safe_length(raw)
        self._emit(raw[:keep])
        self._raw = raw[keep:]

    def _emit(self, data: bytes) -> None:
        if data:
            (self._out if self._nonce is not None else self._between).feed(data)

    # -- command lifecycle -----------------------------------------------------------------------

    def _begin(self) -> str:
        """Start a command: fresh output — after what arrived since the last result (the rest
        of a command that was left waiting for input and then ended by itself, background
        output) — and a nonce."""
        earlier = (self._out, self._between)
        self._out = HeadTail(self._max_output)
        for buf in earlier:
            if buf.head or buf.tail:
                self._out.feed(bytes(buf.head + buf.tail))
        self._between = HeadTail(self._max_output)
        self._nonce = protocol.new_nonce()
        self._issued.append(self._nonce)
        self._status = None
        self._started = self._term.last_data = time.monotonic()
        return self._nonce

    def _finished(self) -> bool:
        return self._nonce is None

    async def _check_usable(self) -> None:
        if self._closed or self.sandbox.closed or not self.alive:
            raise await self._dead()

    async def _dead(self) -> Exception:
        """Why the shell cannot go on: the sandbox closed, the shell exited, or it died."""
        self._nonce = None
        if self._closed:
            return ShellExitedError("the shell session is closed")
        if self.sandbox.closed:
            why = f": {self.sandbox.close_reason}" if self.sandbox.close_reason else ""
            return SandboxClosedError(f"sandbox {self.sandbox.id} is closed{why}")
        code = self._term.tty.exit_status()
        for _ in range(20):  # the terminal can hang up just before the process ends
            if code is not None:
                break
            await asyncio.sleep(0.05)
            code = self._term.tty.exit_status()
        if code is not None and 0 <= code < 128:
            return ShellExitedError(f"the shell exited with status {code}", exit_code=code)
        return SandboxDiedError(f"the sandbox's shell died (status {code})", status=code)

    async def _guard(self, work: Awaitable[CommandResult]) -> CommandResult:
        try:
            return await work
        except asyncio.CancelledError:
            # The caller gave up mid-way: what the command is doing is unknown, so the shell
            # and all it started are killed rather than left running unseen.
            await self.close()
            raise

    async def _interrupted(self) -> CommandResult:
        await self._interrupt()
        return self._result(exit_code=self._status)

    async def _type_and_collect(self, data: bytes, timeout: float | None) -> CommandResult:
        deadline = None if timeout is None else self._started + timeout
        if not await self._term.write(data, deadline):  # the command reads none of it
            await self._interrupt()
            return self._result(timed_out=True, exit_code=None)
        while not self._finished():
            if self._term.gone:
                self._term.drain()  # output written just before the end
                if self._finished():
                    break
                raise await self._dead()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                await self._interrupt()
                return self._result(timed_out=True, exit_code=None)
            idle = now - self._term.last_data >= self._input_idle_s
            if idle and await self._reading_input():
                # The command may have finished meanwhile, and bash itself read the tty: what
                # it wrote before that read (its marker) is in the terminal already.
                self._term.drain()
                if not self._finished():
                    return self._result(waiting=True, exit_code=None)
            await self._term.wait(_TICK_S if deadline is None else min(_TICK_S, deadline - now))
        result = self._result(exit_code=self._status)
        if self._fed_input:
            # Input the command left unread would be read by bash as commands: Ctrl-C at the
            # prompt flushes the terminal's input queue and any half-typed construct.
            self._fed_input = False
            self._begin()
            await self._term.write(b"\x03")
            await self._resync()
            self._out = HeadTail(self._max_output)
        return result

    async def _reading_input(self) -> bool:
        """Whether the foreground job is blocked reading the terminal. Its leader is checked
        at every tick; all its members, found by a full /proc scan in a thread, once a second."""
        fg = self._term.foreground()
        if fg is None:
            return False
        rdev = self._term.tty.tty_rdev
        if procfs.reading_terminal([fg], rdev):
            return True
        if time.monotonic() < self._next_group_scan:
            return False
        self._next_group_scan = time.monotonic() + _GROUP_SCAN_EVERY_S
        members = await asyncio.to_thread(procfs.group_members, fg)
        return await asyncio.to_thread(procfs.reading_terminal, members, rdev)

    def _result(
        self, *, exit_code: int | None, timed_out: bool = False, waiting: bool = False
    ) -> CommandResult:
        out = self._out
        result = CommandResult(
            output=out.text(clean=True),
            exit_code=exit_code,
            duration_s=time.monotonic() - self._started,
            timed_out=timed_out,
            truncated=out.truncated,
            waiting_for_input=waiting,
            dropped_bytes=out.dropped_bytes,
        )
        self._out = HeadTail(self._max_output)  # a waiting command's later output starts anew
        return result

    async def _interrupt(self) -> None:
        """Ctrl-C; if the foreground job ignores it, SIGKILL its process group; then resync.
        Ctrl-C also flushes the terminal's input queue: nothing typed earlier survives."""
        self._fed_input = False
        self._term.flush_input()  # a full input queue would not even take the Ctrl-C
        await self._term.write(b"\x03")
        if not await self._until_shell_in_foreground(1.0):
            fg = self._term.foreground()
            if fg is not None and fg != self._shell_pgrp:
                # bash goes on with the rest of a command list when a job dies of anything
                # but SIGINT: its own SIGINT makes it drop the rest, as Ctrl-C would have.
                with contextlib.suppress(OSError):
                    if self._shell_pgrp > 0:
                        os.killpg(self._shell_pgrp, signal.SIGINT)
                with contextlib.suppress(OSError):
                    os.killpg(fg, signal.SIGKILL)
            if not await self._until_shell_in_foreground(5.0):
                await self.close()
                raise ShellExitedError("the shell did not come back after an interrupt")
        await self._resync()

    async def _resync(self) -> None:
        """Wait for a fresh marker, typing the request again until one comes: a line typed
        while bash still handles a signal, or still runs a builtin, may be swallowed."""
        nonce = protocol.new_nonce()
        self._nonce = nonce
        self._issued.append(nonce)
        line = protocol.sync_line(nonce)
        deadline = time.monotonic() + _RESYNC_LIMIT_S
        next_send = 0.0
        while not self._finished():
            if self._term.gone:
                raise await self._dead()
            now = time.monotonic()
            if now > deadline:
                await self.close()
                raise ShellExitedError("the shell did not answer after an interrupt")
            if now >= next_send:
                await self._term.write(line)
                next_send = now + _RESYNC_EVERY_S
            await self._term.wait(min(_TICK_S, next_send - now))

    async def _until_shell_in_foreground(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            fg = self._term.foreground()
            if fg is None:
                return False
            if fg == self._shell_pgrp:
                return True
            await asyncio.sleep(0.01)
        return False
