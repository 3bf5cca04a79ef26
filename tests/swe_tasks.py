"""The shipped SWE tasks, prepared once per test session (PyPI is reached at prepare time only)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import Task
from rollserve.settings import Settings
from rollserve.tasks.swe.prepare import prepare_specs
from tests.conformance.conftest import require

SPECS = Path(__file__).parents[1] / "examples" / "swe" / "specs.jsonl"
BOLTONS = "boltons-strutils-unicode-line-separators"
MORE_ITERTOOLS = "more-itertools-value-chain-typeerror"


@dataclass
class Prepared:
    out: Path
    report: dict[str, Any]
    tasks: dict[str, Task]


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The shipped specs built and validated into a session directory."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("swe-data"))
    require(SandboxManager(settings), "bwrap")
    out = tmp_path_factory.mktemp("swe-tasks")
    asyncio.run(prepare_specs(SPECS, out, settings))
    report = json.loads((out / "report.json").read_text())
    lines = (out / "tasks.jsonl").read_text().splitlines()
    tasks = [Task.model_validate_json(line) for line in lines]
    return Prepared(out, report, {t.task_id: t for t in tasks})
