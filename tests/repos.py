"""Small git repositories made on the spot, as workspace templates."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_repo(path: Path, files: dict[str, bytes]) -> Path:
    """A repository at ``path`` with ``files`` committed."""
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path
