"""A mount namespace of one sandbox's own, for the mounts a sandbox needs where rollserve is not
root: a user and mount namespace (where Linux >= 5.11 mounts overlayfs with ``userxattr``, and
any kernel mounts a tmpfs), held open by one small process for the sandbox's life.

Every process of the sandbox enters that namespace (``nsenter``) just before its backend's
wrapper runs, so bwrap and Apptainer find the mounts where they bind the workspace from; rollserve
itself reaches the files through ``/proc/PID/root``. Nothing is mounted on the host: when the
holder and the sandbox's processes are gone, the kernel drops the mounts with the namespace (a
crashed server included), and what is left to remove is plain directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import SandboxStartError

_UNSAFE_IN_OPTIONS = (",", ":", "\\", "\n")
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Overlay:
    """``target`` becomes a writable view of ``lower`` (under ``layers``, topmost first: an
    earlier overlay's upper directories); the writes land in ``upper``."""

    lower: Path
    upper: Path
    work: Path
    target: Path
    layers: tuple[Path, ...] = ()

    def options(self, userxattr: bool) -> str:
        paths = (*self.layers, self.lower, self.upper, self.work)
        if any(ch in str(p) for p in paths for ch in _UNSAFE_IN_OPTIONS):
            raise SandboxStartError(
                f"cannot mount an overlay over {self.lower}: a path holds a character "
                "mount options cannot carry"
            )
        lowers = ":".join(str(p) for p in (*self.layers, self.lower))
        opts = f"lowerdir={lowers},upperdir={self.upper},workdir={self.work}"
        return opts + (",userxattr" if userxattr else "")


@dataclass(frozen=True)
class Tmpfs:
    """A tmpfs of at most ``size_mb`` at ``target`` (where an overlay's upper layer can live)."""

    target: Path
    size_mb: int


Mount = Overlay | Tmpfs


def mount_script(mounts: list[Mount]) -> str:
    """The shell lines that make ``mounts`` in order (directories included), as the holder
    runs them."""
    lines = ["set -e"]
    for mount in mounts:
        if isinstance(mount, Tmpfs):
            size = f"size={mount.size_mb}m,mode=0755"
            lines.append(f"mount -t tmpfs -o {size} tmpfs {shlex.quote(str(mount.target))}")
        else:
            dirs = " ".join(shlex.quote(str(d)) for d in (mount.upper, mount.work))
            lines.append(f"mkdir -p {dirs}")
            opts = shlex.quote(mount.options(userxattr=True))
            lines.append(f"mount -t overlay overlay -o {opts} {shlex.quote(str(mount.target))}")
    return "\n".join(lines)


class MountHolder:
    """The process holding a sandbox's user and mount namespace open (see the module)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(
        cls, mounts: list[Mount], note: Callable[[int], object] | None = None
    ) -> MountHolder:
        """Make the namespace with ``mounts`` in it; ``note`` is called with the holder's PID
        as soon as it exists (so a crash from then on finds it). Raises SandboxStartError
        with the kernel's words where a mount is refused."""
        script = mount_script(mounts)
        script += "\necho ready\nexec sleep infinity </dev/null >/dev/null 2>&1"
        proc = await asyncio.create_subprocess_exec(
            *_holder_argv(),
            "sh",
            "-c",
            script,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            if note is not None:
                note(proc.pid)
            assert proc.stdout is not None and proc.stderr is not None
            async with asyncio.timeout(_START_TIMEOUT_S):
                ready = await proc.stdout.read()  # EOF: ready, or the holder is gone
                err = await proc.stderr.read()
            if ready.strip() != b"ready":
                await proc.wait()
                why = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
                raise SandboxStartError(f"a rootless mount was refused: {why}")
        except BaseException:
            await _kill(proc)
            raise
        return cls(proc)

    def enter(self) -> list[str]:
        """The prefix that runs a command inside the namespace, as the same user."""
        return [
            "nsenter",
            f"--target={self.pid}",
            "--user",
            "--mount",
            "--preserve-credentials",
            "--",
        ]

    def host_path(self, path: Path) -> Path:
        """Where rollserve reaches ``path`` as the namespace sees it."""
        return Path(f"/proc/{self.pid}/root") / path.relative_to("/")

    async def close(self) -> None:
        """End the holder (its mounts go once nothing else is in the namespace)."""
        await _kill(self.proc)


def _holder_argv() -> list[str]:
    # It dies with rollserve; the user namespace maps only rollserve's own user (to itself),
    # and --keep-caps lets the shell keep the namespace's capabilities for its mounts.
    return [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "--user",
        "--map-current-user",
        "--keep-caps",
        "--mount",
        "--propagation",
        "private",
        "--",
    ]


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
    await asyncio.shield(proc.wait())
