"""SWE-bench-format rows (SWE-bench, SWE-bench Verified, SWE-Gym, SWE-smith, R2E-Gym, nemo-gym's
SWE sets) turned into ``swebench`` tasks: each row's image resolved from its ``image`` column or
a template, the test lists parsed whether they are JSON strings or lists, and every field the
task does not need kept in its metadata."""

from __future__ import annotations

import importlib
import json
import string
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import SandboxRef, Task
from rollserve.tasks.base import jsonable
from rollserve.tasks.swebench.handler import WORKSPACE, SwebenchHandler

# SWE-bench's own image naming (its harness: ``sweb.eval.{arch}.{instance_id}``, with ``__``
# written ``_1776_`` because Docker names cannot hold a double underscore), on Docker Hub.
DEFAULT_IMAGE_TEMPLATE = "docker://swebench/{swebench_image}:latest"
_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_HARNESS = ("eval_script", "log_parser", "eval_type")  # SWE-bench 5.x rows carry these
_USED = {*_REQUIRED, *_LISTS, *_HARNESS, "version", "environment_setup_commit", "image"}
_PLACEHOLDERS = {"instance_id", "swebench_image", "repo", "version"}


class RowReport(BaseModel):
    """One row: the task it became, or why it could not be used."""

    row: int
    task_id: str | None = None
    valid: bool = False
    image: str | None = None
    grading: str | None = None  # how its evaluation will be graded
    reason: str | None = None


def swebench_image_name(instance_id: str, arch: str = "x86_64") -> str:
    """The SWE-bench harness's image name of an instance."""
    return f"sweb.eval.{arch}.{instance_id.replace('__', '_1776_')}".lower()


def check_template(template: str) -> None:
    """The image template names only known placeholders."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    unknown = names - _PLACEHOLDERS
    if unknown:
        raise InvalidInputError(
            f"image template {template!r} names unknown placeholders {sorted(unknown)} "
            f"(known: {', '.join(sorted(_PLACEHOLDERS))})",
            template=template,
        )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl`` (or ``.json`` list) or ``.parquet`` file."""
    if not path.is_file():
        raise InvalidInputError(f"rows file {path} does not exist", path=str(path))
    if path.suffix == ".parquet":
        try:
            pq: Any = importlib.import_module("pyarrow.parquet")  # ships no type hints
        except ImportError as exc:
            raise InvalidInputError(
                "reading Parquet needs pyarrow (pip install pyarrow)", path=str(path)
            ) from exc
        return list(pq.read_table(path).to_pylist())
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise InvalidInputError(f"{path} must hold a JSON list of rows", path=str(path))
        return data
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            rows.append({"__error__": f"line {number} is not JSON: {exc}"})
    return rows


def test_list(row: dict[str, Any], name: str) -> list[str]:
    """``FAIL_TO_PASS``/``PASS_TO_PASS``: a list of strings, or a JSON string of one."""
    value = row.get(name)
    if value is None:
        raise ValueError(f"{name} is missing")
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is neither a list nor a JSON list: {exc}") from None
    if hasattr(value, "tolist"):  # a numpy array, as Parquet readers give
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{name} must be a list of test names")
    return list(value)


def row_task(row: dict[str, Any], template: str) -> Task:
    """The ``swebench`` task of one row (ValueError naming the field when it is unusable)."""
    if "__error__" in row:
        raise ValueError(row["__error__"])
    if not isinstance(row, dict):
        raise ValueError("the row is not an object")
    for name in _REQUIRED:
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} is missing or not a non-empty string")
    instance_id: str = row["instance_id"]
    fail_to_pass = test_list(row, "FAIL_TO_PASS")
    if not fail_to_pass:
        raise ValueError("FAIL_TO_PASS is empty: nothing would show a fix")
    pass_to_pass = test_list(row, "PASS_TO_PASS")
    version = row.get("version")
    image = row.get("image")
    if not (isinstance(image, str) and image.strip()):
        image = template.format(
            instance_id=instance_id,
            swebench_image=swebench_image_name(instance_id),
            repo=row["repo"],
            version=version or "",
        )
    metadata = {k: v for k, v in row.items() if k not in _USED and jsonable(v)}
    metadata["gold_patch"] = row["patch"]
    metadata["source"] = "swebench-row"
    fields: dict[str, Any] = {
        "instance_id": instance_id,
        "repo": row["repo"],
        "base_commit": row["base_commit"],
        "test_patch": row["test_patch"],
        "fail_to_pass": fail_to_pass,
        "pass_to_pass": pass_to_pass,
    }
    if version is not None:
        fields["version"] = str(version)
    for name in ("environment_setup_commit", *_HARNESS):
        if isinstance(row.get(name), str) and row[name].strip():
            fields[name] = row[name]
    return Task(
        task_id=instance_id,
        kind="swebench",
        prompt=row["problem_statement"],
        sandbox=SandboxRef(image=image, workspace=WORKSPACE),
        metadata=metadata,
        **fields,
    )


def _graded(handler: SwebenchHandler, task: Task, pytest_fallback: bool) -> tuple[Task, str]:
    """The task, validated, and how it will be graded (in words)."""
    extra = task.model_extra or {}
    try:
        handler.validate(task)
    except InvalidInputError as exc:
        unknown = exc.details.get("field") in ("task.repo", "task.version")
        if not (pytest_fallback and unknown):
            raise
        task = task.model_copy(update={"grading": "pytest"})
        handler.validate(task)
        return task, f"rollserve pytest (--pytest-fallback), since {exc.message}"
    if extra.get("eval_script"):
        return task, f"swebench harness: the row's eval_script and {extra['log_parser']}"
    spec, _ = handler.specs.lookup(extra["repo"], extra.get("version"))
    source = handler.specs.sources[spec.source]
    return task, f"swebench harness: rollserve's table ({source}) and {spec.parser}"


def import_rows(
    rows_path: Path,
    out: Path,
    template: str = DEFAULT_IMAGE_TEMPLATE,
    *,
    pytest_fallback: bool = False,
) -> list[RowReport]:
    """Write ``out/tasks.jsonl`` (one task per usable row) and ``out/report.json``.

    A classic row (no ``eval_script``) of a repository or version that rollserve's table of the
    harness's specifications does not know is reported unusable; with ``pytest_fallback`` it
    becomes a task graded by rollserve's own pytest run instead, and its report says so."""
    check_template(template)
    handler = SwebenchHandler()
    rows = read_rows(rows_path)
    reports: list[RowReport] = []
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, 1):
        report = RowReport(row=number)
        reports.append(report)
        if isinstance(row, dict) and isinstance(row.get("instance_id"), str):
            report.task_id = row["instance_id"]
        try:
            task = row_task(row, template)
            task, report.grading = _graded(handler, task, pytest_fallback)
        except (ValueError, KeyError, IndexError) as exc:
            report.reason = str(exc)
            continue
        except InvalidInputError as exc:
            report.reason = exc.message
            continue
        if task.task_id in seen:
            report.reason = f"instance_id {task.task_id!r} repeats an earlier row"
            continue
        seen.add(task.task_id)
        report.valid = True
        report.image = task.sandbox.image if task.sandbox else None
        tasks.append(task)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    body = {
        "source": str(rows_path),
        "image_template": template,
        "pytest_fallback": pytest_fallback,
        "rows": len(rows),
        "tasks": [r.model_dump(mode="json") for r in reports],
    }
    (out / "report.json").write_text(json.dumps(body, indent=2) + "\n")
    return reports
