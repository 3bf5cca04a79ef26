"""Wire models shared by server and client."""

from rollserve.schema.bench import ShellBenchResult
from rollserve.schema.sandbox import (
    ApptainerSpec,
    BackendCheck,
    BwrapSpec,
    ExecResult,
    LocalSpec,
    SandboxLimits,
    SandboxSpec,
)
from rollserve.schema.shell import CommandResult

__all__ = [
    "ApptainerSpec",
    "BackendCheck",
    "BwrapSpec",
    "CommandResult",
    "ExecResult",
    "LocalSpec",
    "SandboxLimits",
    "SandboxSpec",
    "ShellBenchResult",
]
