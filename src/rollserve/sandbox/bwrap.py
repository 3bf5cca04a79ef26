"""bubblewrap: rootless namespaces; the host's system directories or a root-filesystem image."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from rollserve.errors import BackendUnavailableError, InvalidInputError
from rollserve.images.base import RunnableImage
from rollserve.sandbox.base import GUEST_WORKSPACE, Availability, Launcher
from rollserve.sandbox.env import checked_mounts, guest_binds, sandbox_env
from rollserve.schema.sandbox import BwrapSpec, SandboxSpec
from rollserve.settings import Settings

# Top-level host directories that make up the "host" image; everything else of the host
# (home directories, /root, /var, /srv, /mnt, the project) stays invisible.
_HOST_SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_HOST_SECRET_FILES = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/machine-id",
)
_HOST_SECRET_DIRS = ("/etc/ssl/private", "/etc/sudoers.d", "/etc/ssh")
# Directories the sandbox gets fresh, never from the image.
_FRESH = {"proc", "dev", "tmp", "sys", "run", "workspace", "root"}


class BwrapBackend:
    """Sandboxes made with ``bwrap``: own user, PID, IPC, UTS and network namespaces."""

    name = "bwrap"
    spec_type = BwrapSpec

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._size_option: bool | None = None

    def _binary(self) -> str | None:
        return shutil.which(self.settings.bwrap_binary)

    def availability(self) -> Availability:
        binary = self._binary()
        if binary is None:
            return Availability(
                False,
                f"{self.settings.bwrap_binary!r} not found on PATH (apt-get install bubblewrap)",
            )
        # The probe binds / recursively: a mount under it that vanishes mid-bind (another
        # sandbox's workspace going away) fails one try, not the host, so it tries again.
        for _ in range(3):
            probe = subprocess.run(
                [binary, "--unshare-all", "--ro-bind", "/", "/", "true"],
                capture_output=True,
                text=True,
                check=False,
            )
            if probe.returncode == 0:
                break
        if probe.returncode != 0:
            return Availability(
                False, f"bwrap cannot create namespaces here: {probe.stderr.strip()}"
            )
        if not self._sizes_tmpfs(binary):
            return Availability(
                True,
                unenforced={
                    "disk_mb": "this bwrap has no --size (bubblewrap >= 0.5): /tmp, /run and "
                    "/root are tmpfs limited only by memory"
                },
            )
        return Availability(True)

    def _sizes_tmpfs(self, binary: str) -> bool:
        """Whether this bwrap can limit a tmpfs's size (``--size``, bubblewrap 0.5+)."""
        if self._size_option is None:
            shown = subprocess.run([binary, "--help"], capture_output=True, text=True, check=False)
            self._size_option = "--size" in shown.stdout
        return self._size_option

    def launcher(
        self,
        spec: SandboxSpec,
        workspace: Path,
        *,
        image: RunnableImage | None,
        guest_workspace: str | None,
    ) -> Launcher:
        assert isinstance(spec, BwrapSpec)
        binary = self._binary()
        if binary is None:
            raise BackendUnavailableError(self.availability().reason, backend=self.name)
        if image is None or image.kind == "sif":
            raise InvalidInputError(
                f"bwrap needs a root-filesystem directory, not {spec.image!r}", image=spec.image
            )
        root, only = image.path, (_HOST_SYSTEM if image.kind == "host" else None)
        guest = guest_workspace or GUEST_WORKSPACE
        parts = PurePosixPath(guest).parts
        top = parts[1] if len(parts) == 2 else None  # replaced whole by the workspace
        args = [
            binary,
            "--die-with-parent",
            "--unshare-all",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
        ]
        if os.geteuid() != 0:
            # An ordinary user's sandbox lives in a user namespace, inside which the kernel
            # would let it make more (and mount in them): bwrap stops that.
            args += ["--unshare-user", "--disable-userns"]
        if spec.network:
            args.append("--share-net")
        if spec.writable_root:  # the workspace is the whole root, an overlay of the image
            args += ["--bind", str(workspace), "/"]
        else:
            for entry in sorted(os.scandir(root), key=lambda e: e.name):
                if entry.name in _FRESH or entry.name == top or (only and entry.name not in only):
                    continue
                if entry.is_symlink():
                    args += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]
                elif entry.is_dir():
                    args += ["--ro-bind", entry.path, f"/{entry.name}"]
        # A sandbox's root is the host's root (uid 0 maps to 0 when rollserve runs as root),
        # whom the kernel lets write sysctls by file mode alone (kernel.core_pattern runs a
        # program as root on the host): bwrap 0.8 leaves /proc/sys writable, so cover it.
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
        args += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger", "--dev", "/dev"]
        size = spec.limits.disk_mb
        # A writable root keeps /tmp and /root in its layer, as a container's are.
        for fresh in ("/run",) if spec.writable_root else ("/tmp", "/run", "/root"):
            if size is not None and self._sizes_tmpfs(binary):
                args += ["--size", str(size * 1024 * 1024)]
            args += ["--tmpfs", fresh]
        if only is not None:
            # After the tmpfs mounts, which would otherwise hide binds below them (/root).
            for extra in self.settings.bwrap_host_binds:
                args += ["--ro-bind-try", str(extra), str(extra)]
            # The host's secrets stay out of the host image.
            for secret in _HOST_SECRET_FILES:
                if os.path.lexists(secret):
                    args += ["--ro-bind", "/dev/null", secret]
            for secret in _HOST_SECRET_DIRS:
                if os.path.isdir(secret):
                    args += ["--tmpfs", secret]
        for mount in checked_mounts(spec.mounts):
            args += ["--ro-bind", str(mount), str(mount)]
        for source, target, writable in guest_binds(spec, workspace):
            args += ["--bind" if writable else "--ro-bind", str(source), target]
        if not spec.writable_root:
            args += ["--bind", str(workspace), guest, "--chdir", guest, "--remount-ro", "/"]
        else:
            args += ["--chdir", guest]
        args.append("--clearenv")
        for key, value in sandbox_env(
            spec.env, home="/root", image=image.config.env, path_prepend=spec.path_prepend
        ).items():
            args += ["--setenv", key, value]
        args.append("--")
        # bwrap's --new-session leaves the sandbox without a controlling terminal; setsid -c
        # makes the sandbox's own PTY the controlling tty again, so Ctrl-C reaches commands.
        return Launcher(
            prefix=args,
            tty_prefix=[*args, "setsid", "-w", "-c"],
            tty_inside=True,
            dies_with_parent=True,
            signal_as_status=True,
            contained=True,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            workspace=guest,
        )
