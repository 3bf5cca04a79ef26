"""Sandboxes: rootless isolation for agent episodes (bwrap, apptainer, local)."""

from rollserve.sandbox import procfs
from rollserve.sandbox.base import Availability, Launcher, Sandbox, SandboxBackend, TtyProcess
from rollserve.sandbox.instance import SandboxInstance
from rollserve.sandbox.manager import SandboxManager, default_backends, spec_for

__all__ = [
    "Availability",
    "Launcher",
    "Sandbox",
    "SandboxBackend",
    "SandboxInstance",
    "SandboxManager",
    "TtyProcess",
    "default_backends",
    "procfs",
    "spec_for",
]
