"""Sandbox specs (backend-neutral image/template references), limits, and exec/check results."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollserve.schema.wire import WireModel


class _Model(WireModel):
    pass


class SandboxLimits(_Model):
    """Resource limits of one sandbox; ``None`` means unlimited."""

    wall_time_s: float | None = Field(3600.0, gt=0, description="the sandbox is closed after this")
    memory_mb: int | None = Field(4096, gt=0, description="memory of all its processes together")
    max_processes: int | None = Field(1024, gt=0, description="tasks (processes + threads)")
    max_file_size_mb: int | None = Field(1024, gt=0, description="largest file a process may write")
    disk_mb: int | None = Field(
        10240,
        gt=0,
        description="space for the sandbox's writable files (workspace and, in bwrap, each "
        "tmpfs); writing past it fails with ENOSPC",
    )
    max_output_bytes: int = Field(
        100_000, ge=1024, description="command output kept (head + tail) per command"
    )


def check_guest_workspace(value: str | None) -> str | None:
    """A workspace inside the image: an absolute, normalized path below ``/``."""
    if value is None:
        return None
    path = PurePosixPath(value)
    normal = str(path) == value.rstrip("/")
    if not path.is_absolute() or ".." in path.parts or not normal or len(path.parts) < 2:
        raise ValueError(f"{value!r} must be an absolute directory below / (no '..')")
    if path.parts[1] in _SYSTEM_DIRS:
        raise ValueError(f"{value!r} is a system directory; name the repository's directory")
    return str(path)


_SYSTEM_DIRS = {"proc", "dev", "sys", "tmp", "run", "usr", "bin", "sbin", "lib", "lib64", "etc"}

RUN_DIR = "/run/rollserve"
"""Where a sandbox with ``run_dir`` sees its own run directory (read-only; ``out`` in it is
writable): what rollserve hands an agent process (its task, the gateway's socket)."""


class Bind(_Model):
    """A host file or directory bound into the sandbox at ``target``."""

    source: Path = Field(description="an existing absolute host path")
    target: str = Field(description="the absolute path inside the sandbox")
    writable: bool = False

    @field_validator("source")
    @classmethod
    def _source(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{value} must be an absolute host path")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return check_bind_target(value)


def check_bind_target(value: str) -> str:
    """Where a bind may land in a sandbox: an absolute path below / (no '..'), outside
    /proc, /dev and /sys."""
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
        raise ValueError(f"{value!r} must be an absolute path below / (no '..')")
    if path.parts[1] in ("proc", "dev", "sys"):
        raise ValueError(f"{value!r} is inside /{path.parts[1]}")
    return str(path)


class SandboxSpec(_Model):
    """What a sandbox is made of, whatever its backend: each backend's own spec (its
    ``spec_type``) adds its fields and fixes ``backend`` to its name."""

    backend: str
    template: Path | None = Field(
        None, description="directory copied into the sandbox's private workspace"
    )
    workspace: str | None = Field(
        None,
        description="a directory inside the image (e.g. /testbed) made writable for this "
        "sandbox and used as its workspace, instead of a template at /workspace; default: "
        "the image's WORKDIR when it has one and no template is given",
    )
    mounts: list[Path] = Field(
        default_factory=list,
        description="host directories bound read-only at the same path (a prepared environment)",
    )
    network: bool = Field(False, description="network access; off unless asked")
    binds: list[Bind] = Field(
        default_factory=list, description="host paths bound at other paths inside the sandbox"
    )
    run_dir: bool = Field(
        False,
        description=f"a private directory of the sandbox's own at {RUN_DIR} (read-only inside, "
        "but for its out/), removed with the sandbox",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    path_prepend: list[str] = Field(
        default_factory=list,
        description="directories put first on the image's PATH (an environment to activate)",
    )
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    writable_root: bool = Field(
        False,
        description="the image's whole root filesystem writable for this sandbox, through an "
        "overlay (bwrap): what it writes anywhere but /proc, /dev and /run lands in one "
        "layer, which the sandbox can hand on when it closes",
    )
    lower_layers: list[Path] = Field(
        default_factory=list,
        description="layers kept from earlier sandboxes, laid over the image (topmost "
        "first); needs writable_root",
    )

    @field_validator("lower_layers")
    @classmethod
    def _layers(cls, value: list[Path]) -> list[Path]:
        for layer in value:
            if not layer.is_absolute():
                raise ValueError(f"{layer} must be an absolute host path")
        return value

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, value: str | None) -> str | None:
        return check_guest_workspace(value)

    @model_validator(mode="after")
    def _one_workspace(self) -> SandboxSpec:
        if self.workspace is not None and self.template is not None:
            raise ValueError("give a template or a workspace inside the image, not both")
        if self.lower_layers and not self.writable_root:
            raise ValueError("lower_layers are laid under a writable root: set writable_root")
        if self.writable_root and self.template is not None:
            raise ValueError("a writable root is the image's own: give no template")
        return self


class BwrapSpec(SandboxSpec):
    """A bubblewrap sandbox: the host's system directories or a root-filesystem directory."""

    backend: Literal["bwrap"] = "bwrap"
    image: str = Field(
        "host",
        description="'host', a named image, a root-filesystem directory, a .sif file, "
        "oci-archive:FILE[:TAG], docker-archive:FILE[:TAG] or oci:DIR[:TAG]",
    )


class ApptainerSpec(SandboxSpec):
    """An Apptainer/Singularity sandbox from a .sif file or a sandbox directory."""

    backend: Literal["apptainer"] = "apptainer"
    image: str = Field(
        "base",
        description="a named image, a .sif file, a sandbox directory, "
        "oci-archive:FILE[:TAG], docker-archive:FILE[:TAG] or oci:DIR[:TAG]",
    )


class LocalSpec(SandboxSpec):
    """A temporary directory on the host and no isolation at all: development only."""

    backend: Literal["local"] = "local"


class ExecResult(_Model):
    """The outcome of one non-interactive process run in a sandbox."""

    exit_code: int | None = Field(description="None when the process was killed by the timeout")
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = Field(False, description="the output was cut (head and tail kept)")


class LimitCheck(_Model):
    """How one limit is enforced for a sandbox here, or why it is not."""

    enforced: bool
    how: str


class BackendCheck(_Model):
    """One line of ``rollserve sandbox check``."""

    name: str
    available: bool
    reason: str = ""
    user: str = Field("", description="the user the check ran as (name and uid)")
    unenforced: dict[str, str] = Field(
        default_factory=dict, description="limits this host cannot enforce, and why"
    )
    limits: dict[str, LimitCheck] = Field(
        default_factory=dict, description="each SandboxLimits field: enforced or not, and how"
    )
    closes: str = Field("", description="how a close finds every process of the sandbox")
    workspace: str = Field(
        "", description="how a workspace inside an image is made writable: overlay or copy"
    )
    workspace_note: str = Field("", description="where, or why not an overlay")
    start_p50_ms: float | None = None
    starts: int = 0
