"""``rollserve tasks prepare-swe``: the shipped specs are valid; bad specs are reported invalid
with the reason (exit code 1); a re-run over the same directory starts each task afresh."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from rollserve.sandbox import SandboxManager
from rollserve.tasks.swe.handler import SweHandler
from tests.conformance.conftest import require
from tests.swe_tasks import BOLTONS, MORE_ITERTOOLS, Prepared

ROLLSERVE = shutil.which("rollserve") or str(Path(__file__).parents[2] / ".venv/bin/rollserve")


def test_the_shipped_specs_are_valid(prepared: Prepared) -> None:
    reports = {r["task_id"]: r for r in prepared.report["tasks"]}
    assert set(reports) == {BOLTONS, MORE_ITERTOOLS}
    for report in reports.values():
        assert report["valid"], report["reason"]
        assert set(report["before"]["fail_to_pass"].values()) == {"failed"}
        assert set(report["before"]["pass_to_pass"].values()) == {"passed"}
        assert set(report["after"]["fail_to_pass"].values()) == {"passed"}
        assert 5 <= len(report["after"]["pass_to_pass"]) <= 20
    for task in prepared.tasks.values():
        extra = task.model_extra or {}
        assert task.kind == "swe" and task.prompt and task.metadata["gold_patch"]
        assert set(extra) == {
            "repo",
            "env",
            "test_patch",
            "fail_to_pass",
            "pass_to_pass",
            "setup_commands",
            "test_args",
            "python_path",
        }
        repo = Path(extra["repo"])
        log = subprocess.run(
            ["git", "log", "--oneline"], cwd=repo, capture_output=True, text=True, check=True
        )
        assert len(log.stdout.splitlines()) == 1
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
        )
        assert status.stdout == ""
        assert (Path(extra["env"]) / "bin" / "python").exists()
        SweHandler().validate(task)


def _project(root: Path) -> Path:
    """A tiny project with a bug (``add`` subtracts) and a setup step that builds a module."""
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text(
        "from calc._built import OFFSET\n\n\ndef add(a, b):\n    return a - b + OFFSET\n"
    )
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
    )
    return root


_TEST_PATCH = "".join(
    [
        "--- a/tests/test_calc.py\n",
        "+++ b/tests/test_calc.py\n",
        "@@ -4,3 +4,7 @@\n",
        " \n",
        " def test_zero():\n",
        "     assert add(0, 0) == 0\n",
        "+\n",
        "+\n",
        "+def test_add():\n",
        "+    assert add(2, 3) == 5\n",
    ]
)
_GOLD = "".join(
    [
        "--- a/calc/__init__.py\n",
        "+++ b/calc/__init__.py\n",
        "@@ -2,4 +2,4 @@\n",
        " \n",
        " \n",
        " def add(a, b):\n",
        "-    return a - b + OFFSET\n",
        "+    return a + b + OFFSET\n",
    ]
)


def _spec(task_id: str, source: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "problem_statement": "add() subtracts",
        "source": source,
        "test_deps": ["pytest"],
        "setup_commands": ["python -c \"open('calc/_built.py', 'w').write('OFFSET = 0')\""],
        "test_patch": _TEST_PATCH,
        "gold_patch": _GOLD,
        "fail_to_pass": ["tests/test_calc.py::test_add"],
        "pass_to_pass": ["tests/test_calc.py::test_zero"],
        **fields,
    }


def test_bad_specs_are_reported_invalid(tmp_path: Path, manager: SandboxManager) -> None:
    require(manager, "bwrap")
    local = {"path": str(_project(tmp_path / "calc-src"))}
    no_field = _spec("no-field", local)
    del no_field["fail_to_pass"]
    specs = [
        _spec("good", local),
        no_field,
        _spec("unknown-package", {"pypi": "rollserve-no-such-package-zzz==0.0.1"}),
        _spec("gold-does-not-apply", local, gold_patch=_GOLD.replace("a - b", "a * b")),
        _spec("already-passes", local, fail_to_pass=["tests/test_calc.py::test_zero"]),
        _spec("no-such-test", local, pass_to_pass=["tests/test_calc.py::test_nothing"]),
    ]
    spec_file = tmp_path / "specs.jsonl"
    spec_file.write_text("".join(json.dumps(s) + "\n" for s in specs) + "{not json\n")
    out = tmp_path / "out"
    (out / "gold-does-not-apply").mkdir(parents=True)  # a half-built task of an earlier run
    (out / "gold-does-not-apply" / "stale").write_text("")
    (out / "good" / "repo").mkdir(parents=True)
    (out / "good" / "repo" / "stale").write_text("")

    data = tmp_path / "data"
    proc = subprocess.run(
        [ROLLSERVE, "tasks", "prepare-swe", str(spec_file), "--out", str(out), "--data-dir", data],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reports = {r["task_id"]: r for r in json.loads((out / "report.json").read_text())["tasks"]}
    assert reports["good"]["valid"], reports["good"]
    assert "fail_to_pass" in reports["no-field"]["reason"]
    assert "required" in reports["no-field"]["reason"].lower()
    assert "cannot fetch rollserve-no-such-package-zzz" in reports["unknown-package"]["reason"]
    assert "gold patch does not apply" in reports["gold-does-not-apply"]["reason"]
    assert (
        "fail_to_pass test tests/test_calc.py::test_zero is passed before the fix"
        in reports["already-passes"]["reason"]
    )
    assert "test_nothing is missing" in reports["no-such-test"]["reason"]
    assert reports["line 7"]["reason"].startswith("not JSON")
    assert sum(not r["valid"] for r in reports.values()) == 6
    assert "good" in proc.stdout and "no-field" in proc.stdout

    # Only the valid task is written, and only its directory is left; nothing stale in it.
    lines = (out / "tasks.jsonl").read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == ["good"]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "good",
        "report.json",
        "tasks.jsonl",
    ]
    repo = out / "good" / "repo"
    assert not (repo / "stale").exists()
    # What the setup commands built is there, and kept out of the repository's diff.
    assert (repo / "calc" / "_built.py").exists()
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert status.stdout == ""
