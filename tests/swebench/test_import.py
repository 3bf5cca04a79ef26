"""``rollserve tasks import swebench``: SWE-bench-format rows into ``swebench`` tasks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import Task
from rollserve.tasks.swebench.rows import import_rows, swebench_image_name
from tests.cli.test_cli import ROLLSERVE

PATCH = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x\n+y\n"
TESTS = "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-p\n+q\n"


def row(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "instance_id": "owner__project-123",
        "repo": "pytest-dev/pytest",  # a repository the harness's table knows
        "base_commit": "0" * 40,
        "problem_statement": "it breaks",
        "patch": PATCH,
        "test_patch": TESTS,
        "FAIL_TO_PASS": json.dumps(["t.py::test_new"]),
        "PASS_TO_PASS": ["t.py::test_old"],
        "version": "7.0",
        "hints_text": "look at a.py",
        "created_at": "2024-05-01T00:00:00Z",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tasks_of(out: Path) -> list[Task]:
    return [
        Task.model_validate_json(line)
        for line in (out / "tasks.jsonl").read_text().split("\n")
        if line
    ]


def test_image_name_follows_swe_bench() -> None:
    assert (
        swebench_image_name("django__django-11099") == "sweb.eval.x86_64.django_1776_django-11099"
    )
    assert swebench_image_name("Owner__Repo-1") == "sweb.eval.x86_64.owner_1776_repo-1"


def test_rows_become_tasks(tmp_path: Path) -> None:
    rows = [
        row(),
        row(instance_id="owner__project-124", FAIL_TO_PASS=["t.py::test_a"], PASS_TO_PASS="[]"),
        row(instance_id="owner__project-125", image="oci-archive:/images/p125.tar"),
    ]
    reports = import_rows(write_rows(tmp_path / "rows.jsonl", rows), tmp_path / "out")
    assert [r.valid for r in reports] == [True, True, True]
    tasks = {t.task_id: t for t in tasks_of(tmp_path / "out")}
    first = tasks["owner__project-123"]
    extra = first.model_extra or {}
    assert first.kind == "swebench"
    assert first.prompt == "it breaks"
    assert first.sandbox is not None
    assert first.sandbox.image == "docker://swebench/sweb.eval.x86_64.owner_1776_project-123:latest"
    assert first.sandbox.workspace == "/testbed"
    assert extra["fail_to_pass"] == ["t.py::test_new"]  # a JSON string in the row
    assert extra["pass_to_pass"] == ["t.py::test_old"]  # a list in the row
    assert (extra["repo"], extra["version"], extra["test_patch"]) == (
        "pytest-dev/pytest",
        "7.0",
        TESTS,
    )
    assert first.metadata["gold_patch"] == PATCH
    assert first.metadata["hints_text"] == "look at a.py"  # fields it does not need are kept
    assert first.metadata["created_at"] == "2024-05-01T00:00:00Z"
    assert (tasks["owner__project-124"].model_extra or {})["pass_to_pass"] == []
    assert tasks["owner__project-125"].sandbox.image == "oci-archive:/images/p125.tar"  # type: ignore[union-attr]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["rows"] == 3
    assert all(t["valid"] for t in report["tasks"])


def test_template_placeholders(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", [row()])
    import_rows(rows, tmp_path / "out", "oci-archive:/data/{repo}/{swebench_image}-{version}.tar")
    task = tasks_of(tmp_path / "out")[0]
    assert task.sandbox is not None
    expected = "oci-archive:/data/pytest-dev/pytest/sweb.eval.x86_64.owner_1776_project-123-7.0.tar"
    assert task.sandbox.image == expected
    with pytest.raises(InvalidInputError, match="unknown placeholders"):
        import_rows(rows, tmp_path / "out", "docker://x/{nope}")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"patch": None}, "patch is missing"),
        ({"base_commit": ""}, "base_commit is missing"),
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS is neither a list nor a JSON list"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS is empty"),
        ({"PASS_TO_PASS": None}, "PASS_TO_PASS is missing"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS must be a list of test names"),
        ({"eval_script": "#!/bin/bash\n"}, "names the harness's log parser"),
        ({"eval_script": "x", "log_parser": "parse_log_nothing"}, "has no parser"),
        ({"FAIL_TO_PASS": ["-x"]}, "is not a pytest node id"),
    ],
)
def test_unusable_rows_are_reported(tmp_path: Path, change: dict[str, Any], reason: str) -> None:
    bad = row(instance_id="owner__project-9", **change)
    if change.get("patch", "") is None:
        bad.pop("patch", None)
    rows = write_rows(tmp_path / "rows.jsonl", [row(), bad])
    reports = import_rows(rows, tmp_path / "out")
    assert [r.valid for r in reports] == [True, False]
    assert reports[1].task_id == "owner__project-9"
    assert reason in (reports[1].reason or "")
    assert [t.task_id for t in tasks_of(tmp_path / "out")] == ["owner__project-123"]


def test_broken_lines_and_repeats(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row()) + "\n{oops\n" + json.dumps(row()) + "\n")
    reports = import_rows(path, tmp_path / "out")
    assert [r.valid for r in reports] == [True, False, False]
    assert "line 2 is not JSON" in (reports[1].reason or "")
    assert "repeats an earlier row" in (reports[2].reason or "")


def test_parquet_rows(tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow")

    rows = [row(), row(instance_id="owner__project-7", FAIL_TO_PASS=["t.py::test_b"])]
    table = pyarrow.Table.from_pylist(
        [
            {
                **r,
                "FAIL_TO_PASS": json.dumps(r["FAIL_TO_PASS"])
                if isinstance(r["FAIL_TO_PASS"], list)
                else r["FAIL_TO_PASS"],
            }
            for r in rows
        ]
    )
    pq.write_table(table, tmp_path / "rows.parquet")
    reports = import_rows(tmp_path / "rows.parquet", tmp_path / "out")
    assert [r.valid for r in reports] == [True, True]
    assert (tasks_of(tmp_path / "out")[1].model_extra or {})["fail_to_pass"] == ["t.py::test_b"]


def test_command_exit_code(tmp_path: Path) -> None:
    good = write_rows(tmp_path / "good.jsonl", [row()])
    done = subprocess.run(
        [ROLLSERVE, "tasks", "import", "swebench", str(good), "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "1/1 rows became tasks" in done.stdout
    bad = write_rows(tmp_path / "bad.jsonl", [row(), row(instance_id="x__y-1", test_patch="")])
    done = subprocess.run(
        [ROLLSERVE, "tasks", "import", "swebench", str(bad), "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "x__y-1" in done.stdout and "test_patch is missing" in done.stdout
    missing = subprocess.run(
        [ROLLSERVE, "tasks", "import", "swebench", str(tmp_path / "nope.jsonl"), "--out", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode != 0
    assert "nope.jsonl does not exist" in missing.stderr + missing.stdout


def test_classic_rows_of_unknown_repositories_are_refused_or_fall_back(tmp_path: Path) -> None:
    rows = write_rows(
        tmp_path / "rows.jsonl",
        [
            row(),
            row(instance_id="owner__project-1", repo="owner/project"),
            row(instance_id="owner__project-2", version="99.9"),
            row(instance_id="owner__project-3", repo="owner/project", eval_script="#!/bin/bash\n",
                log_parser="parse_log_pytest"),
        ],
    )  # fmt: skip
    reports = import_rows(rows, tmp_path / "strict")
    assert [r.valid for r in reports] == [True, False, False, True]
    assert "no test specification for 'owner/project'" in (reports[1].reason or "")
    assert "--pytest-fallback" in (reports[1].reason or "")
    assert "django/django" in (reports[1].reason or "")  # it lists what it knows
    assert "pytest-dev/pytest has no test specification for version '99.9'" in (
        reports[2].reason or ""
    )
    assert "swebench 4.1.0" in (reports[0].grading or "")
    assert "parse_log_pytest" in (reports[0].grading or "")
    assert "the row's eval_script" in (reports[3].grading or "")

    reports = import_rows(rows, tmp_path / "fallback", pytest_fallback=True)
    assert [r.valid for r in reports] == [True, True, True, True]
    assert (reports[1].grading or "").startswith("rollserve pytest (--pytest-fallback)")
    tasks = {t.task_id: t.model_extra or {} for t in tasks_of(tmp_path / "fallback")}
    assert tasks["owner__project-1"]["grading"] == "pytest"
    assert "grading" not in tasks["owner__project-123"]
    report = json.loads((tmp_path / "fallback" / "report.json").read_text())
    assert report["pytest_fallback"] is True
    assert report["tasks"][1]["grading"] == reports[1].grading


def test_the_fallback_flag_on_the_command_line(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", [row(repo="owner/project")])
    command = [ROLLSERVE, "tasks", "import", "swebench", str(rows), "--out", str(tmp_path / "o")]
    strict = subprocess.run(command, capture_output=True, text=True, check=False)
    assert strict.returncode == 1 and "owner/project" in strict.stdout
    loose = subprocess.run(
        [*command, "--pytest-fallback"], capture_output=True, text=True, check=False
    )
    assert loose.returncode == 0, loose.stdout + loose.stderr
