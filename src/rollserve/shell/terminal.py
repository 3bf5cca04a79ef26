"""The host side of a shell's pseudo-terminal: non-blocking reads and writes on its master."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import termios
import time
from collections.abc import Callable

from rollserve.errors import SandboxDiedError
from rollserve.sandbox.base import TtyProcess

_WINSIZE = struct.pack("HHHH", 40, 200, 0, 0)  # rows, columns: what programs format for
_WRITE_STALL_S = 30.0


class Terminal:
    """Reads whatever the sandbox writes (handing it to ``on_data``) and types into it.

    The sandbox owns the descriptor and may close it at any time (marking the
    :class:`TtyProcess` closed after unhooking the reader); from then on this object never
    touches it and reports the terminal as gone.
    """

    def __init__(self, tty: TtyProcess, on_data: Callable[[bytes], None]) -> None:
        self.tty = tty
        self._on_data = on_data
        self._event = asyncio.Event()
        self._eof = False
        self.last_data = time.monotonic()
        fcntl.ioctl(tty.master_fd, termios.TIOCSWINSZ, _WINSIZE)
        asyncio.get_running_loop().add_reader(tty.master_fd, self.drain)

    @property
    def gone(self) -> bool:
        """The shell process ended, or every holder of the terminal closed it."""
        return self._eof or self.tty.closed or self.tty.exit_status() is not None

    def drain(self) -> None:
        """Read everything available now."""
        if self.tty.closed:
            return
        try:
            while chunk := os.read(self.tty.master_fd, 65536):
                self.last_data = time.monotonic()
                self._on_data(chunk)
            self._hang_up()  # read() returned b"": end of file
        except BlockingIOError:
            pass
        except OSError:  # EIO: every process holding the terminal is gone
            self._hang_up()
        self._event.set()

    def _hang_up(self) -> None:
        self._eof = True
        self.detach()

    def detach(self) -> None:
        """Stop watching the descriptor (it stays open: the sandbox closes it)."""
        if not self.tty.closed:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.tty.master_fd)

    async def wait(self, seconds: float) -> None:
        """Until new output arrives, or ``seconds`` pass."""
        self._event.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.001)):
                await self._event.wait()

    async def write(self, data: bytes, deadline: float | None = None) -> bool:
        """Type ``data``, waiting while the terminal's input queue is full. Returns False if
        ``deadline`` (monotonic) passed first; without one, a shell that reads none of its
        input for a long while is taken for dead."""
        stall_end = time.monotonic() + _WRITE_STALL_S
        view = memoryview(data)
        while view:
            if self.tty.closed:
                raise SandboxDiedError("the shell's terminal is closed")
            try:
                view = view[os.write(self.tty.master_fd, view) :]
                stall_end = time.monotonic() + _WRITE_STALL_S
                continue
            except BlockingIOError:
                pass
            except OSError as exc:
                self._eof = True
                raise SandboxDiedError(f"cannot write to the shell: {exc}") from exc
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if now >= stall_end:
                raise SandboxDiedError(f"the shell read none of its input for {_WRITE_STALL_S}s")
            await self._writable(min(0.1, (deadline or now + 0.1) - now))
        return True

    async def _writable(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_writer(self.tty.master_fd, wake)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(seconds, 0.001)):
                    await ready
        finally:
            if not self.tty.closed:
                loop.remove_writer(self.tty.master_fd)

    def flush_input(self) -> None:
        """Drop whatever was typed and not yet read (from the terminal's side: on the master,
        a flush would drop the sandbox's output instead)."""
        if self.tty.closed:
            return
        fd = os.open(self.tty.tty_path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            termios.tcflush(fd, termios.TCIFLUSH)
        finally:
            os.close(fd)

    def foreground(self) -> int | None:
        """The terminal's foreground process group (a host PID)."""
        if self.tty.closed:
            return None
        try:
            return os.tcgetpgrp(self.tty.master_fd)
        except OSError:
            return None

    def echo_off(self) -> None:
        """A program killed mid-way (an editor, a pager) may leave echo on: turn it off."""
        if self.tty.closed:
            return
        attrs = termios.tcgetattr(self.tty.master_fd)
        if attrs[3] & termios.ECHO:
            attrs[3] &= ~termios.ECHO
            termios.tcsetattr(self.tty.master_fd, termios.TCSANOW, attrs)
