"""The sandbox Protocols: a backend turns a spec into a launcher; a sandbox runs processes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rollserve.images.base import RunnableImage
from rollserve.schema.sandbox import ExecResult, SandboxLimits, SandboxSpec

GUEST_WORKSPACE = "/workspace"


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here and, if not, why; ``unenforced`` names the limits
    (``SandboxLimits`` fields) it cannot enforce on this host, each with the reason."""

    available: bool
    reason: str = ""
    unenforced: dict[str, str] = field(default_factory=dict)


@dataclass
class Launcher:
    """How one sandbox's processes are started: the wrapper argv and its environment.

    ``prefix + argv`` runs ``argv`` inside the sandbox. ``tty_prefix`` is used instead for a
    process on a pseudo-terminal; when ``tty_inside`` is true the wrapper makes the terminal the
    controlling tty inside the sandbox itself (bwrap starts a new session there), otherwise the
    spawner does it for the wrapper process. ``dies_with_parent`` says the wrapper already
    kills itself when rollserve dies (bwrap --die-with-parent). ``address_space_inside`` says
    an address-space rlimit must be set inside the sandbox, not on the wrapper.
    ``signal_as_status`` says the wrapper reports a command killed by a signal as an exit
    status (128 + N) and is killed by one only from outside: a sandbox killed underneath its
    command, not the command's own end (Apptainer re-raises its command's signal instead).
    ``contained`` says every process started through it runs in user and PID namespaces of
    its own that end with the wrapper process: killing the wrapper kills all it started, and
    nothing it started outlives it, so no search for its processes is ever needed.
    """

    prefix: list[str]
    env: dict[str, str]
    workspace: str
    tty_prefix: list[str] | None = None
    tty_inside: bool = False
    dies_with_parent: bool = False
    address_space_inside: bool = False
    signal_as_status: bool = False
    contained: bool = False
    cwd: str | None = None

    def argv(self, argv: Sequence[str], *, tty: bool = False) -> list[str]:
        prefix = self.tty_prefix if tty and self.tty_prefix is not None else self.prefix
        return [*prefix, *argv]


@dataclass
class TtyProcess:
    """A sandbox process on a pseudo-terminal; the shell package speaks to it."""

    popen: subprocess.Popen[bytes]
    master_fd: int
    tty_rdev: int
    tty_path: str  # the terminal's device on the host (/dev/pts/N)
    closed: bool = False  # set by the sandbox once it closed master_fd: never touch it then

    def exit_status(self) -> int | None:
        """The exit status (negative: killed by that signal) once the process ended — without
        reaping it: until the sandbox does, its PID, the id of the session it leads, cannot be
        reused, so that session can still be killed safely."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        try:
            info = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.popen.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


class SandboxBackend(Protocol):
    """A kind of sandbox (bwrap, apptainer, local), registered by name; ``spec_type`` is its
    spec (``SandboxSpec`` with the backend's own fields, ``backend`` fixed to ``name``)."""

    name: str

    @property
    def spec_type(self) -> type[SandboxSpec]: ...

    def availability(self) -> Availability:
        """Whether this backend can start sandboxes on this host."""
        ...

    def launcher(
        self,
        spec: SandboxSpec,
        workspace: Path,
        *,
        image: RunnableImage | None,
        guest_workspace: str | None,
    ) -> Launcher:
        """Say how to run processes in the sandbox: ``image`` is what the image store made
        runnable of ``spec.image`` (None for a backend without images); the host directory
        ``workspace`` is bound at ``guest_workspace`` (None: at /workspace)."""
        ...


class Sandbox(Protocol):
    """One live sandbox with a private workspace."""

    id: str
    backend: str
    limits: SandboxLimits
    guest_workspace: str
    run_dir: Path | None  # the host side of /run/rollserve (a spec's ``run_dir``), or None

    @property
    def closed(self) -> bool: ...

    @property
    def close_reason(self) -> str:
        """Why it closed on its own (a limit), or "" """
        ...

    @property
    def workspace(self) -> Path:
        """The workspace directory as seen from the host."""
        ...

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run one process to completion (a string runs under ``bash -c``); output beyond
        ``max_output_bytes`` (default: the sandbox's limit) keeps its head and tail."""
        ...

    async def spawn_tty(self, argv: Sequence[str], env: dict[str, str] | None = None) -> TtyProcess:
        """Start ``argv`` inside the sandbox on a new pseudo-terminal."""
        ...

    async def release_tty(self, tty: TtyProcess) -> None:
        """Kill a terminal process and everything it started, and close its terminal."""
        ...

    def limit_events(self) -> dict[str, int]:
        """How often the sandbox hit its limits so far (``memory_mb``: processes killed,
        ``max_processes``: forks refused), where the host counts them."""
        ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def diff(self) -> str:
        """The workspace's changes as a unified diff (git diff where it is a repository)."""
        ...

    async def close(self) -> None:
        """Kill every process, remove everything the sandbox created. Idempotent."""
        ...
