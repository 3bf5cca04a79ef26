"""Scoring ``swe`` tasks in real bwrap sandboxes: the gold patch through the submit agent, an
empty submission, a patch that does not apply, tampering with the hidden tests, a hanging test
run, and the workspace diff of a fix made in the run sandbox."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rollserve.errors import InfrastructureError
from rollserve.node import default_plugins
from rollserve.pipeline.stages import StageRunner
from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import ExitReason, JobRequest, RolloutResult, Task
from rollserve.schema.run import RunOutput
from rollserve.settings import Settings
from tests.conformance.conftest import require
from tests.swe_tasks import BOLTONS, MORE_ITERTOOLS, Prepared
from tests.tasks.conftest import make_patch, replace_in, with_fields


@pytest.fixture
def runner(settings: Settings, manager: SandboxManager) -> StageRunner:
    require(manager, settings.default_sandbox_backend)
    return StageRunner(settings, manager, default_plugins())


def submit_request(task: Task, submission: str) -> JobRequest:
    return JobRequest(task=task, agent={"name": "submit", "submission": submission})


async def submitted(runner: StageRunner, task: Task, submission: str) -> RolloutResult:
    """The job's three stages, as the scheduler runs them, with the submit agent."""
    request = submit_request(task, submission)
    sandbox = await runner.init(request)
    try:
        output = await runner.run("job", request, sandbox, timeout_s=60)
    finally:
        if sandbox is not None:
            await runner.sandboxes.close(sandbox)
    return await runner.evaluate(request, output)


async def scored(runner: StageRunner, task: Task, submission: str | None) -> RolloutResult:
    """The eval stage alone, on a given submission."""
    output = RunOutput(ExitReason.SUBMITTED, submission=submission)
    return await runner.evaluate(submit_request(task, submission or ""), output)


def _no_sandboxes_left(manager: SandboxManager) -> None:
    assert manager.live == {}
    state_dir = manager.settings.state_dir
    assert not state_dir.exists() or list(state_dir.iterdir()) == []


@pytest.mark.parametrize("task_id", [BOLTONS, MORE_ITERTOOLS])
async def test_the_gold_patch_scores_1(
    prepared: Prepared, runner: StageRunner, task_id: str
) -> None:
    task = prepared.tasks[task_id]
    result = await submitted(runner, task, task.metadata["gold_patch"])
    assert result.reward == 1.0, result.evaluation
    evaluation = result.evaluation
    assert evaluation["applied"] == "git apply"
    assert "reason" not in evaluation
    outcomes = {**evaluation["fail_to_pass"], **evaluation["pass_to_pass"]}
    extra = task.model_extra or {}
    assert set(outcomes) == {*extra["fail_to_pass"], *extra["pass_to_pass"]}
    assert set(outcomes.values()) == {"passed"}
    assert result.patch == task.metadata["gold_patch"]
    _no_sandboxes_left(runner.sandboxes)


@pytest.mark.parametrize("task_id", [BOLTONS, MORE_ITERTOOLS])
async def test_an_empty_submission_scores_0(
    prepared: Prepared, runner: StageRunner, task_id: str
) -> None:
    result = await submitted(runner, prepared.tasks[task_id], "")
    assert result.reward == 0.0
    evaluation = result.evaluation
    assert evaluation["applied"] == "none"
    assert set(evaluation["fail_to_pass"].values()) == {"failed"}
    assert set(evaluation["pass_to_pass"].values()) == {"passed"}
    assert "FAILED" in evaluation["test_output"]


async def test_a_patch_that_does_not_apply_scores_0(
    prepared: Prepared, runner: StageRunner
) -> None:
    patch = (
        "--- a/boltons/strutils.py\n+++ b/boltons/strutils.py\n@@ -1,3 +1,3 @@\n"
        " no such line\n-nor this one\n+replaced\n nothing here\n"
    )
    for submission in (patch, "this is not a patch at all\n"):
        result = await scored(runner, prepared.tasks[BOLTONS], submission)
        assert result.reward == 0.0
        assert "does not apply" in result.evaluation["reason"]
        assert result.evaluation["applied"] == "none"
        assert set(result.evaluation["fail_to_pass"].values()) == {"missing"}


async def test_a_fuzzy_patch_falls_back_to_patch(
    prepared: Prepared, runner: StageRunner, tmp_path: Path
) -> None:
    task = prepared.tasks[MORE_ITERTOOLS]
    gold = task.metadata["gold_patch"]
    # Shift the hunk: git apply refuses a wrong context line, patch -F2 accepts it.
    fuzzy = gold.replace(" def product_index(", " def product_index_elsewhere(")
    assert fuzzy != gold
    result = await scored(runner, task, fuzzy)
    assert result.evaluation["applied"] == "patch -F2", result.evaluation
    assert result.reward == 1.0


async def test_editing_the_hidden_tests_does_not_help(
    prepared: Prepared, runner: StageRunner, tmp_path: Path
) -> None:
    task = prepared.tasks[BOLTONS]
    fake = (
        "\n\ndef test_iter_splitlines_unicode_line_endings(line_ending=None):\n    pass\n"
        "\n\ndef test_iter_splitlines_preserves_numbers_after_spaces():\n    pass\n"
        "\n\ndef test_indent_unicode_line_endings():\n    pass\n"
    )

    def edit(repo: Path) -> None:
        test_file = repo / "tests" / "test_strutils.py"
        test_file.write_text(test_file.read_text() + fake)

    result = await scored(runner, task, make_patch(task, tmp_path, edit))
    assert result.reward == 0.0
    assert result.evaluation["applied"] == "git apply"
    assert set(result.evaluation["fail_to_pass"].values()) == {"failed"}


async def test_a_hanging_test_run_scores_0_and_leaves_nothing(
    prepared: Prepared, runner: StageRunner, tmp_path: Path
) -> None:
    task = with_fields(prepared.tasks[BOLTONS], test_timeout_s=3)

    def edit(repo: Path) -> None:
        replace_in(repo / "boltons" / "strutils.py", "import re\n", "import re\nimport time\n")
        module = repo / "boltons" / "strutils.py"
        module.write_text(module.read_text() + "\ntime.sleep(10**6)\n")

    started = time.monotonic()
    result = await scored(runner, task, make_patch(task, tmp_path, edit))
    assert time.monotonic() - started < 60
    assert result.reward == 0.0
    assert "timed out" in result.evaluation["reason"]
    assert set(result.evaluation["fail_to_pass"].values()) == {"missing"}
    _no_sandboxes_left(runner.sandboxes)


async def test_a_fix_made_in_the_run_sandbox_is_the_submission(
    prepared: Prepared, runner: StageRunner
) -> None:
    task = prepared.tasks[BOLTONS]
    request = submit_request(task, "")
    sandbox = await runner.init(request)
    assert sandbox is not None
    try:
        hidden = await sandbox.exec("grep -c test_indent_unicode_line_endings tests/*.py")
        assert hidden.stdout.strip().endswith(":0")  # the hidden tests are not in the workspace
        fix = await sandbox.exec(
            "sed -i 's/\\\\x2028|\\\\x2029/\\\\u2028|\\\\u2029/' boltons/strutils.py && "
            "python -m pytest -q -p no:cacheprovider tests/test_strutils.py"
        )
        assert fix.exit_code == 0, fix.stdout + fix.stderr
        diff = await sandbox.diff()
    finally:
        await runner.sandboxes.close(sandbox)
    assert "\\u2028" in diff
    result = await scored(runner, task, diff)
    assert result.reward == 1.0, result.evaluation


async def test_a_test_patch_that_never_applies_is_an_infrastructure_error(
    prepared: Prepared, runner: StageRunner
) -> None:
    task = prepared.tasks[MORE_ITERTOOLS]
    missing = "--- a/tests/nowhere.py\n+++ b/tests/nowhere.py\n@@ -1 +1 @@\n-x\n+y\n"
    broken = with_fields(task, test_patch=missing)
    with pytest.raises(InfrastructureError, match="test patch"):
        await scored(runner, broken, None)
    with pytest.raises(InfrastructureError, match="test patch"):
        await scored(runner, broken, task.metadata["gold_patch"])
    _no_sandboxes_left(runner.sandboxes)


async def test_a_patch_to_git_internals_scores_0(prepared: Prepared, runner: StageRunner) -> None:
    patch = "--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-[core]\n+[core]\n"
    result = await scored(runner, prepared.tasks[BOLTONS], patch)
    assert result.reward == 0.0
    assert ".git" in result.evaluation["reason"]


async def test_a_failing_setup_command_scores_0_with_its_output(
    prepared: Prepared, runner: StageRunner
) -> None:
    flood = "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo the end; exit 3"
    task = with_fields(prepared.tasks[MORE_ITERTOOLS], setup_commands=[flood])
    result = await scored(runner, task, task.metadata["gold_patch"])
    assert result.reward == 0.0
    assert result.evaluation["reason"] == f"setup command failed: {flood}"
    assert result.evaluation["test_output"].endswith("the end\n")
    assert len(result.evaluation["test_output"]) <= 4001


async def test_a_hidden_test_file_the_submission_also_creates_is_replaced(
    prepared: Prepared, runner: StageRunner, tmp_path: Path
) -> None:
    hidden = (
        "--- /dev/null\n+++ b/tests/test_hidden.py\n@@ -0,0 +1,5 @@\n"
        "+from boltons import strutils\n+\n+\n+def test_x():\n"
        "+    assert list(strutils.iter_splitlines('a\\u2028b')) == ['a', 'b']\n"
    )
    task = with_fields(
        prepared.tasks[BOLTONS],
        test_patch=hidden,
        fail_to_pass=["tests/test_hidden.py::test_x"],
        pass_to_pass=[],
    )

    def edit(repo: Path) -> None:
        (repo / "tests" / "test_hidden.py").write_text("def test_x():\n    pass\n")

    result = await scored(runner, task, make_patch(task, tmp_path, edit))
    assert result.reward == 0.0
    assert result.evaluation["fail_to_pass"] == {"tests/test_hidden.py::test_x": "failed"}
    gold = await scored(runner, task, task.metadata["gold_patch"])
    assert gold.reward == 1.0, gold.evaluation
