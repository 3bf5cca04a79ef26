"""The environment every sandbox process starts with, and the host directories it sees."""

from __future__ import annotations

from pathlib import Path

from rollserve.errors import InvalidInputError
from rollserve.schema.sandbox import RUN_DIR, SandboxSpec

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_env(
    extra: dict[str, str],
    *,
    home: str,
    image: dict[str, str] | None = None,
    path_prepend: list[str] | None = None,
) -> dict[str, str]:
    """A clean, predictable environment (no host variables leak in), then the image's own
    (its ``ENV``: a conda environment on ``PATH`` …), then the spec's; ``path_prepend``
    directories go first on the resulting ``PATH``."""
    env = {
        "PATH": SYSTEM_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "MANPAGER": "cat",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(image or {})
    env.update(extra)
    if path_prepend:
        env["PATH"] = ":".join([*path_prepend, env["PATH"]])
    return env


def checked_mounts(mounts: list[Path]) -> list[Path]:
    """The spec's read-only mounts, each an existing absolute host directory."""
    for mount in mounts:
        if not mount.is_absolute() or not mount.is_dir():
            raise InvalidInputError(
                f"sandbox mount {mount} is not an existing absolute directory", mount=str(mount)
            )
    return [mount.resolve() for mount in mounts]


def run_dir_of(workspace: Path) -> Path:
    """The host side of a sandbox's run directory (beside its workspace)."""
    return workspace.parent / "run"


def guest_binds(spec: SandboxSpec, workspace: Path) -> list[tuple[Path, str, bool]]:
    """``(host path, guest path, writable)`` for the sandbox's run directory and the spec's
    binds, in mount order (a bind inside the run directory lands on the placeholder the
    manager made for it)."""
    found: list[tuple[Path, str, bool]] = []
    if spec.run_dir:
        run = run_dir_of(workspace)
        found += [(run, RUN_DIR, False), (run / "out", f"{RUN_DIR}/out", True)]
    for bind in spec.binds:
        if not bind.source.exists():
            raise InvalidInputError(
                f"sandbox bind source {bind.source} does not exist", bind=str(bind.source)
            )
        found.append((bind.source, bind.target, bind.writable))
    return found
