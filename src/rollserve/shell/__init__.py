"""Persistent shell sessions on pseudo-terminals inside sandboxes."""

from rollserve.shell.session import ShellSession

__all__ = ["ShellSession"]
