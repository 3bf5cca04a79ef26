"""``rollserve tasks prepare-swe``: turn SWE task specs (a source release, a test patch, a gold
patch, test ids) into ready ``swe`` tasks — a repository with one commit and a Python
environment per task — validated the SWE-bench way in sandboxes: with only the test patch every
fail-to-pass test fails and every pass-to-pass test passes; with the gold patch too, all pass."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollserve.errors import InvalidInputError, RollserveError
from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import Task
from rollserve.settings import Settings
from rollserve.tasks.swe import build
from rollserve.tasks.swe.handler import SweCheck, SweFields, SweHandler, check_submission


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Source(_Spec):
    """Where a task's repository comes from: exactly one of ``pypi`` and ``path``."""

    pypi: str | None = Field(None, description="NAME==VERSION: that release's sdist")
    path: Path | None = Field(None, description="a source directory (relative: to the specs)")

    @field_validator("pypi")
    @classmethod
    def _requirement(cls, value: str | None) -> str | None:
        if value is not None and not re.match(build.REQUIREMENT, value):
            raise ValueError(f"{value!r} is not NAME==VERSION")
        return value

    @model_validator(mode="after")
    def _one(self) -> Source:
        if (self.pypi is None) == (self.path is None):
            raise ValueError("give exactly one of 'pypi' (NAME==VERSION) and 'path' (a directory)")
        return self

    def as_json(self) -> dict[str, str]:
        return self.model_dump(mode="json", exclude_none=True)


class SweSpec(_Spec):
    """One line of a specs file."""

    task_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=200)
    problem_statement: str = Field(min_length=1)
    source: Source
    python_path: list[str] = Field(default_factory=lambda: ["."])
    test_deps: list[str] = Field(default_factory=lambda: ["pytest"])
    setup_commands: list[str] = Field(default_factory=list)
    test_patch: str
    gold_patch: str = Field(min_length=1)
    fail_to_pass: list[str] = Field(min_length=1)
    pass_to_pass: list[str] = Field(default_factory=list)
    test_args: list[str] = Field(default_factory=list)


class TaskReport(BaseModel):
    """How preparing one task went: valid, or the stage that failed and why."""

    task_id: str
    valid: bool = False
    stage: str = "spec"  # spec, build, validate, done
    reason: str | None = None
    seconds: float = 0.0
    before: dict[str, Any] | None = None  # the test patch alone
    after: dict[str, Any] | None = None  # the gold patch and the test patch


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in exc.errors()
    )


def read_specs(path: Path, only: list[str] | None) -> list[SweSpec | TaskReport]:
    """Each spec line validated; a bad one becomes an invalid report naming the problem."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc
    items: list[SweSpec | TaskReport] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            items.append(TaskReport(task_id=f"line {number}", reason=f"not JSON: {exc}"))
            continue
        named = raw.get("task_id") if isinstance(raw, dict) else None
        task_id = named if isinstance(named, str) and named else f"line {number}"
        if only is not None and task_id not in only:
            continue
        if any(item.task_id == task_id for item in items):
            items.append(TaskReport(task_id=task_id, reason="duplicate task_id"))
            continue
        try:
            spec = SweSpec.model_validate(raw)
            _task(spec, Path("/repo"), Path("/env"))  # the task fields' own checks
        except ValidationError as exc:
            items.append(TaskReport(task_id=task_id, reason=_problems(exc)))
            continue
        if spec.source.path is not None and not spec.source.path.is_absolute():
            spec.source.path = (path.parent / spec.source.path).resolve()
        items.append(spec)
    known = {item.task_id for item in items}
    items += [
        TaskReport(task_id=task_id, reason="no such task_id in the specs file")
        for task_id in only or []
        if task_id not in known
    ]
    return items


def _task(spec: SweSpec, repo: Path, env: Path) -> Task:
    """The ready-to-submit task of a spec (the gold patch rides in its metadata)."""
    own = spec.model_dump(include=set(SweFields.model_fields) - {"test_timeout_s"})
    SweFields.model_validate({**own, "repo": repo, "env": env})
    return Task.model_validate(
        {
            "task_id": spec.task_id,
            "kind": "swe",
            "prompt": spec.problem_statement,
            "metadata": {
                "gold_patch": spec.gold_patch,
                "source": spec.source.as_json(),
            },
            "repo": str(repo),
            "env": str(env),
            **own,
        }
    )


def _judge(before: SweCheck, after: SweCheck) -> list[str]:
    """What makes a task invalid, from its runs before and after the gold patch."""
    if before.test_patch_error is not None:
        return [f"the test patch does not apply: {before.test_patch_error.strip()}"]
    problems = [f"before the fix: {before.reason}"] if before.reason else []
    for test, outcome in before.fail_to_pass.items():
        if outcome not in ("failed", "error"):
            problems.append(f"fail_to_pass test {test} is {outcome} before the fix")
    for test, outcome in before.pass_to_pass.items():
        if outcome != "passed":
            problems.append(f"pass_to_pass test {test} is {outcome} before the fix")
    if after.reason and after.applied == "none":
        problems.append(f"the gold patch does not apply: {after.test_output.strip()[-500:]}")
    elif after.reason:
        problems.append(f"with the gold patch: {after.reason}")
    for kind, outcomes in (
        ("fail_to_pass", after.fail_to_pass),
        ("pass_to_pass", after.pass_to_pass),
    ):
        problems += [
            f"{kind} test {test} is {outcome} with the gold patch"
            for test, outcome in outcomes.items()
            if outcome != "passed"
        ]
    return problems


async def _validate(task: Task, gold_patch: str, manager: SandboxManager) -> tuple[SweCheck, ...]:
    """The task's hidden tests run in two sandboxes: without a fix and with the gold patch."""
    handler = SweHandler()
    fields = handler.fields(task)
    spec = handler.sandbox_spec(task, manager.spec_for(manager.settings.default_sandbox_backend))
    assert spec is not None

    async def check(submission: str | None) -> SweCheck:
        sandbox = await manager.start(spec)
        try:
            return await check_submission(sandbox, fields, submission)
        finally:
            await manager.close(sandbox)

    return tuple(await asyncio.gather(check(None), check(gold_patch)))


async def prepare_task(
    spec: SweSpec, out: Path, manager: SandboxManager, report: TaskReport
) -> Task | None:
    """Build and validate one task under ``out/TASK_ID``; None (and the task's directory
    removed) when it is invalid, with the reason in ``report``."""
    started = time.monotonic()
    task_dir = out / spec.task_id
    task = _task(spec, task_dir / "repo", task_dir / "env")
    fields = SweHandler().fields(task)
    source = spec.source.as_json()
    try:
        report.stage = "build"
        await asyncio.to_thread(
            build.build,
            task_dir,
            source,
            out / ".cache",
            fields,
            spec.test_deps,
        )
        report.stage = "validate"
        before, after = await _validate(task, spec.gold_patch, manager)
        report.before, report.after = before.details(), after.details()
        problems = _judge(before, after)
        if problems:
            raise InvalidInputError("; ".join(problems))
    except (RollserveError, OSError) as exc:
        report.reason = exc.message if isinstance(exc, RollserveError) else str(exc)
        await asyncio.to_thread(build.remove, task_dir)
        return None
    finally:
        report.seconds = round(time.monotonic() - started, 2)
    report.stage, report.valid = "done", True
    return task


async def prepare_specs(
    specs: Path, out: Path, settings: Settings, *, only: list[str] | None = None, jobs: int = 4
) -> list[TaskReport]:
    """Prepare every spec of ``specs`` (or those named in ``only``) under ``out``; writes
    ``out/tasks.jsonl`` (the valid tasks) and ``out/report.json``. With ``only``, the other
    tasks' lines of an earlier run are kept."""
    out = await asyncio.to_thread(out.resolve)
    items = await asyncio.to_thread(read_specs, specs, only)
    reports = [i if isinstance(i, TaskReport) else TaskReport(task_id=i.task_id) for i in items]
    tasks: dict[str, Task] = {}
    gate = asyncio.Semaphore(jobs)
    async with SandboxManager(settings) as manager:

        async def one(spec: SweSpec, report: TaskReport) -> None:
            async with gate:
                task = await prepare_task(spec, out, manager, report)
            if task is not None:
                tasks[spec.task_id] = task

        await asyncio.gather(
            *(one(i, r) for i, r in zip(items, reports, strict=True) if isinstance(i, SweSpec))
        )
    await asyncio.to_thread(write_results, out, reports, tasks, keep_others=only is not None)
    return reports


def write_results(
    out: Path, reports: list[TaskReport], tasks: dict[str, Task], *, keep_others: bool
) -> None:
    """``out/tasks.jsonl`` (one task per valid spec) and ``out/report.json``."""
    redone = {r.task_id for r in reports}
    lines: list[str] = []
    earlier: list[dict[str, Any]] = []
    if keep_others and (out / "tasks.jsonl").exists():
        for line in (out / "tasks.jsonl").read_text().splitlines():
            if line.strip() and json.loads(line).get("task_id") not in redone:
                lines.append(line)
    if keep_others and (out / "report.json").exists():
        old = json.loads((out / "report.json").read_text()).get("tasks", [])
        earlier = [r for r in old if r.get("task_id") not in redone]
    lines += [tasks[r.task_id].model_dump_json() for r in reports if r.task_id in tasks]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tasks.jsonl").write_text("".join(f"{line}\n" for line in lines))
    reported = earlier + [r.model_dump(mode="json") for r in reports]
    (out / "report.json").write_text(json.dumps({"tasks": reported}, indent=2) + "\n")
