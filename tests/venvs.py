"""Virtual environments the tests make for third-party programs (veRL, the gateway's agents),
each made once and kept where its caller says, remade when its requirements change."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

STAMP = ".rollserve-requirements"


def current(venv: Path, requirements: list[str]) -> bool:
    """Whether ``venv`` was made with exactly ``requirements``."""
    stamp = venv / STAMP
    return (venv / "bin" / "python").exists() and (
        stamp.is_file() and stamp.read_text() == " ".join(requirements)
    )


def made_venv(
    venv: Path,
    requirements: list[str],
    *,
    imports: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Path:
    """``venv`` with ``requirements`` installed, made unless it is current; its interpreter.

    pip byte-compiles nothing: most modules of these packages are never imported, and
    compiling all of them was half of each install. ``imports`` are imported once, with
    ``env`` added to the environment, so that what the tests do use has its bytecode written
    here (a sandbox mounts the environment read-only and could not write it). Test workers
    asking at once wait for the one making it."""
    python = venv / "bin" / "python"
    if current(venv, requirements):
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not current(venv, requirements):
            _make(venv, requirements, imports, env)
    return python


def _make(
    venv: Path, requirements: list[str], imports: tuple[str, ...], env: dict[str, str] | None
) -> None:
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
    subprocess.run([*pip, *requirements], check=True, timeout=1200)
    if imports:
        program = "".join(f"import {name}\n" for name in imports)
        environment = {**os.environ, **(env or {})}
        subprocess.run([str(python), "-c", program], check=True, timeout=600, env=environment)
    (venv / STAMP).write_text(" ".join(requirements))
