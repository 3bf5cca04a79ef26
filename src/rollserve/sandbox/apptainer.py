"""Apptainer/Singularity: rootless containers from .sif files or sandbox directories (HPC)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from rollserve.errors import BackendUnavailableError, InvalidInputError
from rollserve.images.base import RunnableImage
from rollserve.sandbox.base import GUEST_WORKSPACE, Availability, Launcher
from rollserve.sandbox.env import checked_mounts, guest_binds, sandbox_env
from rollserve.schema.sandbox import ApptainerSpec, SandboxSpec
from rollserve.settings import Settings


class ApptainerBackend:
    """Sandboxes made with ``apptainer exec --containall``: own PID, IPC and network namespaces,
    a writable tmpfs over the image, the workspace bound at /workspace, no home directory."""

    name = "apptainer"
    spec_type = ApptainerSpec

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _binary(self) -> str | None:
        names = (
            [self.settings.apptainer_binary]
            if self.settings.apptainer_binary
            else ["apptainer", "singularity"]
        )
        for name in names:
            found = shutil.which(name)
            if found:
                return found
        return None

    def availability(self) -> Availability:
        binary = self._binary()
        if binary is None:
            wanted = self.settings.apptainer_binary or "apptainer or singularity"
            return Availability(
                False, f"{wanted} not found on PATH (scripts/install-apptainer.sh installs one)"
            )
        try:
            probe = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
        except subprocess.TimeoutExpired:
            return Availability(False, f"{binary} --version did not answer in 30 s")
        if probe.returncode != 0:
            return Availability(False, f"{binary} --version failed: {probe.stderr.strip()}")
        return Availability(True, probe.stdout.strip())

    def launcher(
        self,
        spec: SandboxSpec,
        workspace: Path,
        *,
        image: RunnableImage | None,
        guest_workspace: str | None,
    ) -> Launcher:
        assert isinstance(spec, ApptainerSpec)
        binary = self._binary()
        if binary is None:
            raise BackendUnavailableError(self.availability().reason, backend=self.name)
        if image is None or image.kind == "host":
            raise InvalidInputError(
                f"apptainer needs a .sif file or a directory image, not {spec.image!r}",
                image=spec.image,
            )
        guest = guest_workspace or GUEST_WORKSPACE
        # Without FUSE (root-only on many hosts) a SIF must be extracted, every start
        # (seconds): prefer sandbox directories for rollouts where FUSE is missing.
        unsquash = image.kind == "sif" and not os.access("/dev/fuse", os.R_OK | os.W_OK)
        rootless = self.settings.apptainer_userns and os.geteuid() != 0
        args = [
            *(_no_more_user_namespaces(3 if unsquash else 2) if rootless else []),
            binary,
            "--silent",
            "exec",
            "--containall",
            "--no-home",
            "--cleanenv",
            # A writable root: the sandbox's own overlay of the image is the container itself
            "--writable" if spec.writable_root else "--writable-tmpfs",
            "--no-mount",
            "cwd",
            # Root in the container is the host's root when rollserve runs as root (--userns
            # maps 0 to 0), and Apptainer gives it every capability of its namespace, /sys
            # with the host's cgroups, and a writable /proc/sys (kernel.core_pattern runs a
            # program as root on the host): drop the privileges, leave /sys out, and make
            # the kernel's global knobs in /proc read-only.
            "--no-privs",
            "--no-mount",
            "sys",
            *_read_only_proc(),
            *([] if spec.writable_root else ["--bind", f"{workspace}:{guest}"]),
            "--pwd",
            guest,
        ]
        for mount in checked_mounts(spec.mounts):
            args += ["--bind", f"{mount}:{mount}:ro"]
        for source, target, writable in guest_binds(spec, workspace):
            args += ["--bind", f"{source}:{target}" + ("" if writable else ":ro")]
        if self.settings.apptainer_userns:
            args.append("--userns")
        if unsquash:
            args.append("--unsquash")
        if not spec.network:
            args += ["--net", "--network", "none"]
        for key, value in sandbox_env(
            spec.env, home="/root", image=image.config.env, path_prepend=spec.path_prepend
        ).items():
            args += ["--env", f"{key}={value}"]
        args.append(str(workspace if spec.writable_root else image.path))
        # Apptainer's scratch (an extracted SIF) goes under the sandbox's own directory, so
        # that it is removed with the sandbox even when apptainer is killed mid-way.
        scratch = workspace.parent / "apptainer-tmp"
        scratch.mkdir(exist_ok=True)
        return Launcher(
            prefix=args,
            env={
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "APPTAINER_TMPDIR": str(scratch),
            },
            workspace=guest,
            cwd=str(workspace),
            address_space_inside=True,
            contained=self.settings.apptainer_userns,
        )


_PROC_KNOBS = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")


def _read_only_proc() -> list[str]:
    """Binds that cover /proc's global, host-root-writable entries read-only."""
    out = []
    for path in _PROC_KNOBS:
        if os.path.exists(path):
            out += ["--bind", f"{path}:{path}:ro"]
    return out


def _no_more_user_namespaces(apptainer_makes: int) -> list[str]:
    """A prefix that runs Apptainer in a user namespace of its own whose limit on nested user
    namespaces is what Apptainer itself makes (1.4: 2, and 3 where it extracts a SIF), so
    that the container can make none, as bwrap's ``--disable-userns`` does: an ordinary
    user's container could otherwise make one and mount inside it. The capabilities the
    prefix holds in its namespace are dropped before Apptainer starts."""
    script = (
        f"echo {apptainer_makes} > /proc/sys/user/max_user_namespaces && "
        'exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"'
    )
    return [
        "unshare",
        "--user",
        "--map-current-user",
        "--keep-caps",
        "--",
        "sh",
        "-c",
        script,
        "apptainer-sandbox",
    ]
