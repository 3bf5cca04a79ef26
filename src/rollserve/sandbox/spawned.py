"""A sandbox's spawned processes and terminals at the lowest level: their input and output
streams, and killing, closing and reaping them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess

from rollserve.errors import InvalidCommandError
from rollserve.sandbox.base import TtyProcess
from rollserve.sandbox.output import HeadTail

READ_CHUNK = 65536

Proc = subprocess.Popen[bytes] | asyncio.subprocess.Process


def kill_unreaped(proc: Proc) -> None:
    """SIGKILL a spawned process and its group — only while it is not yet reaped, when its PID
    and group id cannot name anything else."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def close_tty(tty: TtyProcess) -> None:
    """Close the terminal once; a shell session watching it is unhooked first."""
    if tty.closed:
        return
    tty.closed = True
    loop = asyncio.get_running_loop()
    loop.remove_reader(tty.master_fd)
    loop.remove_writer(tty.master_fd)
    os.close(tty.master_fd)


def reap(popens: list[subprocess.Popen[bytes]]) -> None:
    """Wait for each (killed) process, a few seconds at most."""
    for popen in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)


def check_argv(argv: list[str]) -> None:
    """Refuse an empty command line or one with a NUL byte."""
    if not argv:
        raise InvalidCommandError("empty command")
    for arg in argv:
        if "\x00" in arg:
            raise InvalidCommandError("command contains a NUL byte", argument=arg[:80])


async def pump(stream: asyncio.StreamReader | None, sink: HeadTail) -> None:
    """Read a command's output stream to its end into ``sink``."""
    if stream is None:
        return
    while chunk := await stream.read(READ_CHUNK):
        sink.feed(chunk)


async def feed(stream: asyncio.StreamWriter | None, data: bytes | None) -> None:
    """Write ``data`` to a command's input and close it (a command that stopped reading is
    not an error)."""
    if stream is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            stream.write(data)
            await stream.drain()
        stream.close()
