"""The environment every sandbox process starts with, and the host directories it sees."""

from __future__ import annotations

from pathlib import Path

from rollserve.errors import InvalidInputError

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
