"""The ``swebench`` task kind: a SWE-bench-format instance in its own container image, the
repository at ``/testbed`` inside it (``rollserve tasks import swebench`` writes these tasks).

Evaluation runs in a fresh sandbox of the instance's image and is graded by the SWE-bench
harness: its eval script runs the tests, its log parser reads each test's status, its rule
decides resolution. A SWE-bench 5.x row carries its script (``eval_script``, ``log_parser``,
``eval_type``); for a row in the classic columns (SWE-bench as most copies store it, SWE-Gym),
the script and parser come from rollserve's table of the harness's per-repository, per-version
specifications (``specs``). A task of a repository the table does not know is refused,
unless it asks for rollserve's own pytest run of its test ids (``"grading": "pytest"``)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener, kind_fields
from rollserve.tasks.swe import evaluation
from rollserve.tasks.swe.handler import SweTests, score
from rollserve.tasks.swebench import harness
from rollserve.tasks.swebench.specs import SpecTable

WORKSPACE = "/testbed"
# Where SWE-bench images keep the instance's environment: first on PATH for the agent's shell
# (the harness's own script activates it itself). Directories an image lacks do no harm.
ENVIRONMENT_PATH = ["/opt/miniconda3/envs/testbed/bin", "/opt/miniconda3/bin"]
LOG_LIMIT = 64 * 1024 * 1024  # the eval script's output kept for the parser

SYSTEM_PROMPT = (
    "You are a software engineer. The repository is in {workspace}, a git repository; your "
    "shell starts there, with the project's environment active. Fix the issue the user "
    "describes by changing the repository's source code (there is no network access). Use the "
    "bash tool to explore the code, reproduce the issue and run tests, and the editor tool to "
    "view and edit files. Do not modify the existing tests: hidden tests will check your fix. "
    "When you are done, call the submit tool without an answer: the changes in {workspace} "
    "(its git diff against the original commit) are your submission."
)


class SwebenchFields(SweTests):
    """The kind-specific fields of a ``swebench`` task: the row's own."""

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name of the upstream repository")
    base_commit: str = Field(min_length=1, description="the image's repository commit")
    version: str | None = None
    environment_setup_commit: str | None = None
    eval_script: str | None = Field(None, description="the harness's eval script (5.x rows)")
    log_parser: str | None = Field(None, description="the harness's log parser of the row")
    eval_type: str | None = None
    grading: Literal["harness", "pytest"] = Field(
        "harness",
        description="harness: the SWE-bench harness's script and parser (the row's, else "
        "rollserve's table's); pytest: rollserve's own pytest run of the test ids",
    )
    environment_path: list[str] = Field(
        default_factory=lambda: list(ENVIRONMENT_PATH),
        description="directories put first on PATH in the agent's shell",
    )
    test_timeout_s: float = Field(1800.0, gt=0, description="one test run at most")


class SwebenchHandler:
    """Task kind ``swebench``: reward 1 when the harness resolves the instance with the
    agent's patch (every FAIL_TO_PASS and PASS_TO_PASS test passes), else 0 with the
    per-test statuses and the harness-style report."""

    name = "swebench"

    def __init__(self, specs: SpecTable | None = None) -> None:
        self._specs = specs

    @property
    def specs(self) -> SpecTable:
        """rollserve's table of the harness's test specifications (read on first use)."""
        if self._specs is None:
            self._specs = SpecTable.load()
        return self._specs

    def fields(self, task: Task) -> SwebenchFields:
        """The kind-specific fields; InvalidInputError naming the field if they are wrong."""
        return kind_fields(SwebenchFields, task)

    def validate(self, task: Task) -> None:
        fields = self.fields(task)
        if task.sandbox is None or not task.sandbox.image:
            raise InvalidInputError(
                "task.sandbox.image: a swebench task runs in its instance's image",
                field="task.sandbox.image",
            )
        if fields.eval_script is not None and not fields.log_parser:
            raise InvalidInputError(
                "task.log_parser: a row with an eval_script names the harness's log parser",
                field="task.log_parser",
            )
        if fields.grading == "harness" and fields.eval_script is None:
            self.specs.lookup(fields.repo, fields.version)
        if fields.log_parser and not harness.known_parser(fields.log_parser):
            raise InvalidInputError(
                f"task.log_parser: the SWE-bench harness "
                f"({harness.harness_version()}) has no parser {fields.log_parser!r}",
                field="task.log_parser",
            )

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT.format(workspace=_workspace(task))

    def tools(self, task: Task) -> list[str]:
        return ["bash", "editor", "submit"]

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        fields = self.fields(task)
        path = [*fields.environment_path, *base.path_prepend]
        return base.model_copy(update={"workspace": _workspace(task), "path_prepend": path})

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        return None  # the image holds the repository and its environment

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        fields = self.fields(task)
        submission = output.submission if output.submission and output.submission.strip() else None
        if fields.grading == "pytest":
            check = await score(task.task_id, fields, submission, open_sandbox)
            details = {
                "harness": "rollserve pytest",
                "harness_note": "graded by rollserve's own pytest run of the test ids, as the "
                'task asks ("grading": "pytest"), not by the SWE-bench harness',
                **check.details(),
            }
            reward = 1.0 if check.resolved else 0.0
            return Evaluation(reward=reward, details=details, patch=output.submission)
        image = task.sandbox.image if task.sandbox and task.sandbox.image else ""
        harness_spec = None
        if fields.eval_script is None:
            spec = self.specs.harness_spec(
                fields.repo, fields.version, fields.base_commit, fields.test_patch
            )
            fields = fields.model_copy(
                update={"eval_script": spec.eval_script, "log_parser": spec.log_parser}
            )
            harness_spec = spec.source
        row = harness.instance(fields, image)
        details = await _run_harness(fields, row, submission, open_sandbox)
        if harness_spec is not None:
            details["harness_spec"] = f"rollserve's table, from {harness_spec}"
        reward = 1.0 if details["resolved"] else 0.0
        return Evaluation(reward=reward, details=details, patch=output.submission)


async def _run_harness(
    fields: SwebenchFields,
    row: dict[str, Any],
    submission: str | None,
    open_sandbox: SandboxOpener,
) -> dict[str, Any]:
    details: dict[str, Any] = {
        "harness": f"swebench {harness.harness_version()}",
        "resolved": False,
        "applied": "none",
    }
    async with open_sandbox() as sandbox:
        if submission is not None:
            if any(".git" in PurePosixPath(p).parts for p in evaluation.patch_paths(submission)):
                return {**details, "reason": "the patch changes the repository's .git directory"}
            applied = await evaluation.apply_patch(sandbox, submission, "submission")
            if applied.applied is None:
                reason = "the patch does not apply (git apply and patch -F2 both failed)"
                return {**details, "reason": reason, "test_output": applied.output}
            details["applied"] = applied.applied
        result = await sandbox.exec(
            ["bash", "-c", harness.eval_script(row)],
            timeout=fields.test_timeout_s,
            max_output_bytes=LOG_LIMIT,
        )
    log = result.stdout + result.stderr
    if result.timed_out:
        reason = f"tests timed out after {fields.test_timeout_s:g}s"
        return {**details, "reason": reason, "test_output": evaluation.tail(log)}
    grade = harness.grade(row, log)
    details.update(
        resolved=grade.resolved,
        resolution=grade.resolution,
        tests=grade.statuses,
        report={
            fields.instance_id: {
                "patch_is_None": submission is None,
                "patch_exists": submission is not None,
                "patch_successfully_applied": submission is not None,
                "resolved": grade.resolved,
                "tests_status": grade.report,
            }
        },
        fail_to_pass={t: grade.statuses.get(t, "missing") for t in fields.fail_to_pass},
        pass_to_pass={t: grade.statuses.get(t, "missing") for t in fields.pass_to_pass},
        test_output=evaluation.tail(log),
    )
    if not grade.graded:
        details["reason"] = (
            "the harness found no usable test run in the log (tests errored, a patch failed "
            "to apply, or the output markers are missing)"
        )
    return details


def _workspace(task: Task) -> str:
    if task.sandbox is not None and task.sandbox.workspace:
        return task.sandbox.workspace
    return WORKSPACE
