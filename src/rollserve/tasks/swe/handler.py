"""The ``swe`` task kind: fix an issue in a prepared repository; scored the SWE-bench way by the
hidden tests that must go from failing to passing and those that must keep passing."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.errors import InfrastructureError, InvalidInputError
from rollserve.sandbox.base import GUEST_WORKSPACE, Sandbox
from rollserve.sandbox.env import SYSTEM_PATH
from rollserve.schema.jobs import Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener, kind_fields
from rollserve.tasks.swe import evaluation
from rollserve.tasks.swe.evaluation import Outcome

SYSTEM_PROMPT = (
    "You are a software engineer. The repository is in /workspace, a git repository; your "
    "shell starts there. Fix the issue the user describes by changing the repository's source "
    "code. Use the bash tool to explore the code, reproduce the issue and run the tests with "
    "`python -m pytest` (the project's Python environment is active; there is no network "
    "access), and the editor tool to view and edit files. Do not modify the existing tests: "
    "hidden tests will check your fix, and test files are reset before they run. When you are "
    "done, call the submit tool without an answer: the changes in /workspace (its git diff) "
    "are your submission."
)


class SweTests(BaseModel):
    """What scores a repository task: the hidden tests and how they run."""

    model_config = ConfigDict(extra="forbid")

    test_patch: str = Field(description="the hidden tests, applied only for evaluation")
    fail_to_pass: list[str] = Field(min_length=1, description="pytest node ids that must pass")
    pass_to_pass: list[str] = Field(default_factory=list, description="must keep passing")
    setup_commands: list[str] = Field(default_factory=list, description="run after patching")
    test_args: list[str] = Field(default_factory=list, description="extra pytest arguments")
    test_timeout_s: float = Field(900.0, gt=0, description="a test run (or setup) at most")

    @field_validator("fail_to_pass", "pass_to_pass")
    @classmethod
    def _node_ids(cls, value: list[str]) -> list[str]:
        for node_id in value:
            if not node_id.strip() or node_id.startswith("-"):
                raise ValueError(f"{node_id!r} is not a pytest node id")
        return value


class SweFields(SweTests):
    """The kind-specific fields of an ``swe`` task (``rollserve tasks prepare-swe`` writes
    them)."""

    repo: Path = Field(description="the prepared repository: a git work tree with one commit")
    env: Path = Field(description="the prepared environment, mounted read-only (env/bin/python)")
    python_path: list[str] = Field(
        default_factory=lambda: ["."], description="repository directories put on PYTHONPATH"
    )

    @field_validator("repo", "env")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("python_path")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for entry in value:
            path = PurePosixPath(entry)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"{entry!r} must be relative to the repository root, no '..'")
        return value


@dataclass
class SweCheck:
    """One submission checked against the hidden tests."""

    applied: str = "none"
    fail_to_pass: dict[str, Outcome] = field(default_factory=dict)
    pass_to_pass: dict[str, Outcome] = field(default_factory=dict)
    reason: str | None = None
    test_output: str = ""
    test_patch_error: str | None = None  # the hidden tests could not be put in place

    @property
    def resolved(self) -> bool:
        outcomes = [*self.fail_to_pass.values(), *self.pass_to_pass.values()]
        ok = self.reason is None and self.test_patch_error is None
        return ok and bool(outcomes) and all(o == "passed" for o in outcomes)

    def details(self) -> dict[str, Any]:
        details: dict[str, Any] = {
            "applied": self.applied,
            "fail_to_pass": self.fail_to_pass,
            "pass_to_pass": self.pass_to_pass,
        }
        if self.reason is not None:
            details["reason"] = self.reason
        details["test_output"] = self.test_output
        return details


async def check_submission(sandbox: Sandbox, fields: SweTests, submission: str | None) -> SweCheck:
    """In a fresh sandbox of the task: apply the submission, reset the files of the test patch
    and apply it, run the setup commands again, run the tests."""
    check = SweCheck(
        fail_to_pass=dict.fromkeys(fields.fail_to_pass, "missing"),
        pass_to_pass=dict.fromkeys(fields.pass_to_pass, "missing"),
    )
    if submission:
        if any(".git" in PurePosixPath(p).parts for p in evaluation.patch_paths(submission)):
            check.reason = "the patch changes the repository's .git directory"
            return check
        applied = await evaluation.apply_patch(sandbox, submission, "submission")
        check.test_output = applied.output
        if applied.applied is None:
            check.reason = "the patch does not apply (git apply and patch -F2 both failed)"
            return check
        check.applied = applied.applied
    if fields.test_patch.strip():
        problem = await evaluation.reset_files(sandbox, evaluation.patch_paths(fields.test_patch))
        if problem is None:
            tests = await evaluation.apply_patch(sandbox, fields.test_patch, "tests")
            problem = None if tests.applied else tests.output
        if problem is not None:
            check.test_patch_error = problem
            check.reason = "the test patch does not apply"
            check.test_output = problem
            return check
    setup = await evaluation.run_setup(sandbox, fields.setup_commands, fields.test_timeout_s)
    if setup.failed is not None:
        how = "timed out" if setup.timed_out else "failed"
        check.reason = f"setup command {how}: {setup.failed}"
        check.test_output = setup.output
        return check
    run = await evaluation.run_tests(
        sandbox,
        list(dict.fromkeys([*fields.fail_to_pass, *fields.pass_to_pass])),
        fields.test_args,
        fields.test_timeout_s,
    )
    check.fail_to_pass = {t: run.outcomes[t] for t in fields.fail_to_pass}
    check.pass_to_pass = {t: run.outcomes[t] for t in fields.pass_to_pass}
    check.test_output = run.output
    if run.timed_out:
        check.reason = f"tests timed out after {fields.test_timeout_s:g}s"
    elif run.problem is not None:
        check.reason = run.problem
    return check


class SweHandler:
    """Task kind ``swe``: reward 1 when, with the agent's patch, every ``fail_to_pass`` and
    ``pass_to_pass`` test passes; else 0 with the reason and each test's outcome."""

    name = "swe"

    def fields(self, task: Task) -> SweFields:
        """The kind-specific fields; InvalidInputError naming the field if they are wrong."""
        return kind_fields(SweFields, task)

    def validate(self, task: Task) -> None:
        fields = self.fields(task)
        for name, path, inside in (("repo", fields.repo, ".git"), ("env", fields.env, "bin")):
            if not (path / inside).is_dir():
                raise InvalidInputError(
                    f"task.{name}: {path} is not a prepared {name} (no {inside}/ in it; run "
                    "rollserve tasks prepare-swe)",
                    field=f"task.{name}",
                )

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT

    def tools(self, task: Task) -> list[str]:
        return ["bash", "editor", "submit"]

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        fields = self.fields(task)
        python_path = [posixpath.normpath(f"{GUEST_WORKSPACE}/{p}") for p in fields.python_path]
        env = {
            **base.env,
            "PATH": f"{fields.env}/bin:{SYSTEM_PATH}",
            "PYTHONPATH": ":".join(python_path),
            "VIRTUAL_ENV": str(fields.env),
        }
        mounts = [*base.mounts, fields.env]
        return base.model_copy(update={"template": fields.repo, "mounts": mounts, "env": env})

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        return None  # the template is the prepared repository

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        fields = self.fields(task)
        submission = output.submission if output.submission and output.submission.strip() else None
        check = await score(task.task_id, fields, submission, open_sandbox)
        reward = 1.0 if check.resolved else 0.0
        return Evaluation(reward=reward, details=check.details(), patch=output.submission)


async def score(
    task_id: str, fields: SweTests, submission: str | None, open_sandbox: SandboxOpener
) -> SweCheck:
    """The submission checked in a fresh sandbox. A test patch that does not apply to the
    untouched repository is the task's fault: an InfrastructureError naming it."""
    async with open_sandbox() as sandbox:
        check = await check_submission(sandbox, fields, submission)
    if check.test_patch_error is not None:
        pristine = None
        if submission is not None:  # the submission's fault only if the tests apply alone
            async with open_sandbox() as sandbox:
                pristine = await check_test_patch(sandbox, fields)
        if submission is None or pristine is not None:
            raise InfrastructureError(
                f"the test patch of task {task_id!r} does not apply to its "
                f"repository: {pristine or check.test_patch_error}",
                task_id=task_id,
            )
        check.reason = (
            "the patch conflicts with the hidden tests (the test patch no longer applies)"
        )
    return check


async def check_test_patch(sandbox: Sandbox, fields: SweTests) -> str | None:
    """Whether the test patch applies to the untouched repository: None, or why not."""
    applied = await evaluation.apply_patch(sandbox, fields.test_patch, "tests")
    return None if applied.applied else applied.output
