"""Sandbox specs (backend-neutral image/template references), limits, and exec/check results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SandboxLimits(_Model):
    """Resource limits of one sandbox; ``None`` means unlimited."""

    wall_time_s: float | None = Field(3600.0, gt=0, description="the sandbox is closed after this")
    memory_mb: int | None = Field(4096, gt=0, description="memory of all its processes together")
    max_processes: int | None = Field(1024, gt=0, description="tasks (processes + threads)")
    max_file_size_mb: int | None = Field(1024, gt=0, description="largest file a process may write")
    max_output_bytes: int = Field(
        100_000, ge=1024, description="command output kept (head + tail) per command"
    )


class _SpecBase(_Model):
    template: Path | None = Field(
        None, description="directory copied into the sandbox's private workspace"
    )
    mounts: list[Path] = Field(
        default_factory=list,
        description="host directories bound read-only at the same path (a prepared environment)",
    )
    network: bool = Field(False, description="network access; off unless asked")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


class BwrapSpec(_SpecBase):
    """A bubblewrap sandbox: the host's system directories or a root-filesystem directory."""

    backend: Literal["bwrap"] = "bwrap"
    image: str = Field("host", description="'host', a root-filesystem directory, or a named image")


class ApptainerSpec(_SpecBase):
    """An Apptainer/Singularity sandbox from a .sif file or a sandbox directory."""

    backend: Literal["apptainer"] = "apptainer"
    image: str = Field("base", description="a .sif file, a sandbox directory, or a named image")


class LocalSpec(_SpecBase):
    """A temporary directory on the host and no isolation at all: development only."""

    backend: Literal["local"] = "local"


SandboxSpec = Annotated[BwrapSpec | ApptainerSpec | LocalSpec, Field(discriminator="backend")]


class ExecResult(_Model):
    """The outcome of one non-interactive process run in a sandbox."""

    exit_code: int | None = Field(description="None when the process was killed by the timeout")
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False


class BackendCheck(_Model):
    """One line of ``rollserve sandbox check``."""

    name: str
    available: bool
    reason: str = ""
    start_p50_ms: float | None = None
    starts: int = 0
