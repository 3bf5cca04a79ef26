"""Helpers to make submissions against the shipped SWE tasks (prepared once per session by the
``prepared`` fixture of tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollserve.schema.jobs import Task


def with_fields(task: Task, **fields: Any) -> Task:
    """A copy of ``task`` with kind-specific fields replaced."""
    return Task.model_validate({**task.model_dump(mode="json"), **fields})


def make_patch(task: Task, tmp_path: Path, edit: Callable[[Path], None]) -> str:
    """The ``git diff`` of an edit made to a copy of the task's repository."""
    copy = tmp_path / "edited"
    shutil.copytree((task.model_extra or {})["repo"], copy, symlinks=True)
    edit(copy)
    subprocess.run(["git", "add", "-A"], cwd=copy, check=True, capture_output=True)
    done = subprocess.run(
        ["git", "diff", "--cached", "--binary"],
        cwd=copy,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))
