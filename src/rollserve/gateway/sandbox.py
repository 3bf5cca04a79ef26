"""A job's sandbox as a harness beside it drives it through the gateway: commands in one
persistent PTY shell, and files."""

from __future__ import annotations

from rollserve.errors import RollserveError, ShellExitedError
from rollserve.gateway.base import Refusal
from rollserve.sandbox.base import Sandbox
from rollserve.schema.shell import CommandResult
from rollserve.shell.session import ShellSession


class JobSandbox:
    """The sandbox of one job, for the gateway's ``sandbox/…`` routes."""

    def __init__(self, sandbox: Sandbox, command_timeout_s: float) -> None:
        self.sandbox = sandbox
        self.command_timeout_s = command_timeout_s
        self._shell: ShellSession | None = None

    async def run(self, command: str, timeout: float | None) -> CommandResult:
        """The command's result; a command past its timeout is interrupted, and one that
        waits for keyboard input too (the harness pipes input instead)."""
        limit = min(timeout or self.command_timeout_s, self.command_timeout_s)
        try:
            if self._shell is None or not self._shell.alive:
                self._shell = await ShellSession.open(self.sandbox)
            result = await self._shell.run(command, timeout=limit)
            if result.waiting_for_input:
                await self._shell.interrupt()
        except ShellExitedError as exc:
            await self.close()
            raise Refusal(
                409, f"{exc.message}; the next command starts a new shell", "shell_exited"
            ) from exc
        except RollserveError as exc:
            raise Refusal(400, exc.message, exc.code) from exc
        return result

    async def read(self, path: str) -> bytes:
        try:
            return await self.sandbox.read_file(path)
        except RollserveError as exc:
            raise Refusal(400, exc.message, exc.code, param="path") from exc

    async def write(self, path: str, data: bytes) -> None:
        try:
            await self.sandbox.write_file(path, data)
        except RollserveError as exc:
            raise Refusal(400, exc.message, exc.code, param="path") from exc

    async def close(self) -> None:
        if self._shell is not None:
            await self._shell.close()
            self._shell = None
