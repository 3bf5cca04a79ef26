"""What every bench test shares: bwrap present, and ``rollserve bench …`` run as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings
from tests.conformance.conftest import require

ROLLSERVE = shutil.which("rollserve") or str(Path(__file__).parents[2] / ".venv/bin/rollserve")


@pytest.fixture(autouse=True)
def _bwrap(tmp_path: Path) -> None:
    require(SandboxManager(Settings(data_dir=tmp_path / "data")), "bwrap")


def bench(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [ROLLSERVE, "bench", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang; a loaded machine takes minutes
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report
