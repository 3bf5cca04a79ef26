"""The environment every sandbox process starts with."""

from __future__ import annotations

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_env(extra: dict[str, str], *, home: str) -> dict[str, str]:
    """A clean, predictable environment (no host variables leak in) plus the spec's own."""
    env = {
        "PATH": _PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "MANPAGER": "cat",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env
