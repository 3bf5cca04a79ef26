"""Real SWE-bench rows in their own images, through the real pipeline: a scripted agent fixes
one with bash and editor calls (bwrap and Apptainer) and the SWE-bench harness grades it; every
shipped row validates, the classic ones (django, sympy, SWE-Gym's dask, pylint's twin without
its eval script) graded by the harness through rollserve's table; the pytest fallback; faults."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import AgentConfig, JobRequest, Task
from rollserve.validation import validate_tasks
from tests.conformance.conftest import require
from tests.integration.conftest import Server, scripted_job, tool_call
from tests.leaks import mounts_under
from tests.swebench.conftest import (
    CLASSIC,
    DJANGO,
    INSTANCE,
    ROW_IDS,
    SWE_GYM,
    SYMPY,
    Instance,
    run_jobs,
    validate_command,
)

WRITER_TESTS = "tests/unittest_pyreverse_writer.py"


def _submit(task: Task, job_id: str, submission: str) -> JobRequest:
    agent = AgentConfig.model_validate({"name": "submit", "submission": submission})
    return JobRequest(job_id=job_id, task=task, agent=agent)


@pytest.mark.parametrize("backend", ["bwrap", "apptainer"])
def test_a_scripted_agent_fixes_the_instance(
    server_factory: Callable[..., Server], instance: Instance, backend: str, tmp_path: Path
) -> None:
    require(SandboxManager(instance.settings(tmp_path)), backend)
    task = instance.task()
    gold = task.metadata["gold_patch"]
    turns = [
        tool_call("bash", command="pwd && git log --oneline | head -3 && which python"),
        tool_call("bash", command="python -c 'from pylint.pyreverse.utils import get_annotation'"),
        tool_call("editor", command="create", path="/testbed/fix.patch", file_text=gold),
        tool_call("bash", command="git apply fix.patch && rm fix.patch && git status --short"),
        tool_call("editor", command="view", path="pylint/pyreverse/utils.py", view_range=[1, 5]),
        tool_call(
            "bash",
            command="python -m pytest -q -p no:cacheprovider tests/unittest_pyreverse_writer.py",
        ),
        tool_call("submit"),
    ]
    server = server_factory(default_sandbox_backend=backend, image_cache_dir=str(instance.cache))
    server.start()
    done = scripted_job(server, turns, task, wait=600)
    assert done["status"] == "completed", done
    result = done["result"]
    tools = [m["content"] for m in result["messages"] if m["role"] == "tool"]
    assert len(tools) == len(turns), result  # one observation per call
    assert tools[0].startswith("/testbed") and "/opt/miniconda3/envs/testbed/bin/python" in tools[0]
    assert "cannot import name 'get_annotation'" in tools[1]  # the issue, reproduced
    assert "M pylint/pyreverse/utils.py" in tools[3]
    assert "passed" in tools[5] and "failed" not in tools[5]
    assert result["exit_reason"] == "submitted" and result["tool_errors"] == 0
    assert "fix.patch" not in result["patch"] and "def get_annotation" in result["patch"]
    evaluation = result["evaluation"]
    assert evaluation["harness"].startswith("swebench 5.")
    assert evaluation["resolution"] == "RESOLVED_FULL"
    assert result["reward"] == 1.0, evaluation
    assert set(evaluation["fail_to_pass"].values()) == {"PASSED"}
    report = evaluation["report"][INSTANCE]
    assert report["resolved"] and report["patch_successfully_applied"]
    assert report["tests_status"]["FAIL_TO_PASS"]["failure"] == []


def test_validate_the_shipped_rows_and_a_classic_twin(instance: Instance, tmp_path: Path) -> None:
    done = validate_command(instance.tasks_dir, tmp_path, instance.cache, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"validating {len(ROW_IDS)} tasks" in done.stdout
    lines = done.stdout.splitlines()  # one line per task as soon as its checks are in
    assert {f"valid {t}" for t in ROW_IDS} <= set(lines)
    report = json.loads((instance.tasks_dir / "validation.json").read_text())
    checks = {c["task_id"]: c for c in report["tasks"]}
    assert set(checks) == set(ROW_IDS)
    for check in checks.values():
        assert check["valid"], check
        assert (check["gold"]["reward"], check["empty"]["reward"]) == (1.0, 0.0)
        assert check["gold"]["grader"].startswith("swebench 5."), check  # the harness, always
    for task_id in (CLASSIC, DJANGO, SYMPY):
        assert "rollserve's table, from swebench 4.1.0" in checks[task_id]["gold"]["grader"]
    assert "SWE-Gym" in checks[SWE_GYM]["gold"]["grader"]
    # each test's status, as the harness's parser for the repository read it
    django = checks[DJANGO]
    assert len(django["gold"]["fail_to_pass"]) == 5
    assert set(django["gold"]["fail_to_pass"].values()) == {"PASSED"}
    assert "PASSED" not in set(django["empty"]["fail_to_pass"].values())
    sympy = checks[SYMPY]
    assert sympy["gold"]["fail_to_pass"] == {"test_super_sub": "PASSED"}
    assert sympy["empty"]["fail_to_pass"] == {"test_super_sub": "FAILED"}
    assert sympy["empty"]["pass_to_pass"] == {"test_requires_partial": "PASSED"}
    assert list((tmp_path / "sandboxes").iterdir()) == []


@pytest.mark.parametrize("task_id", [CLASSIC, SWE_GYM])
async def test_classic_rows_are_graded_by_the_harness_through_the_table(
    instance: Instance, tmp_path: Path, task_id: str
) -> None:
    task = instance.task(task_id)
    [gold] = await run_jobs(
        instance.settings(tmp_path), [_submit(task, "gold", task.metadata["gold_patch"])]
    )
    assert gold.result is not None
    evaluation = gold.result["evaluation"]
    assert evaluation["harness"].startswith("swebench 5.")
    assert evaluation["harness_spec"].startswith("rollserve's table, from ")
    assert evaluation["resolution"] == "RESOLVED_FULL"
    assert gold.result["reward"] == 1.0, evaluation
    assert set(evaluation["fail_to_pass"].values()) == {"PASSED"}


async def test_the_pytest_fallback_grades_with_pytest_and_says_so(
    instance: Instance, tmp_path: Path
) -> None:
    task = _pytest_graded(instance.task(CLASSIC))
    [gold] = await run_jobs(
        instance.settings(tmp_path), [_submit(task, "gold", task.metadata["gold_patch"])]
    )
    assert gold.result is not None
    evaluation = gold.result["evaluation"]
    assert evaluation["harness"] == "rollserve pytest"
    assert '"grading": "pytest"' in evaluation["harness_note"]
    assert gold.result["reward"] == 1.0, evaluation
    assert set(evaluation["fail_to_pass"].values()) == {"passed"}


def _pytest_graded(task: Task) -> Task:
    return Task.model_validate({**task.model_dump(mode="json"), "grading": "pytest"})


async def test_a_hanging_test_run_scores_zero_and_frees_the_worker(
    instance: Instance, tmp_path: Path
) -> None:
    task = instance.task()
    hang = Task.model_validate({**task.model_dump(mode="json"), "test_timeout_s": 15})
    sleeper = (
        "diff --git a/tests/conftest.py b/tests/conftest.py\n"
        "--- a/tests/conftest.py\n+++ b/tests/conftest.py\n@@ -1,0 +1,2 @@\n"
        "+import time\n+time.sleep(3600)\n"
    )
    settings = instance.settings(tmp_path, eval_workers=1)
    records = await run_jobs(
        settings,
        [_submit(hang, "hangs", sleeper), _submit(task, "after", task.metadata["gold_patch"])],
    )
    hung, after = records
    assert hung.status.value == "completed", hung
    assert hung.result is not None and hung.result["reward"] == 0.0
    assert hung.result["evaluation"]["reason"] == "tests timed out after 15s"
    assert after.result is not None and after.result["reward"] == 1.0  # the worker was freed
    assert list(settings.state_dir.iterdir()) == []
    assert mounts_under(settings.data_dir) == []


async def test_bad_images_fail_the_job_naming_the_image(instance: Instance, tmp_path: Path) -> None:
    task = instance.task()
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(Path(instance.image.removeprefix("oci-archive:")).read_bytes()[:20000])
    requests = []
    for name, image in (
        ("missing", f"oci-archive:{tmp_path}/no-such-image.tar"),
        ("corrupt", f"oci-archive:{corrupt}"),
    ):
        body = task.model_dump(mode="json")
        body["sandbox"]["image"] = image
        requests.append(_submit(Task.model_validate(body), name, ""))
    settings = instance.settings(tmp_path, max_attempts=2, retry_backoff_s=0)
    missing, broken = await run_jobs(settings, requests)
    assert missing.status.value == "failed" and missing.error is not None
    assert missing.error["code"] == "image_not_found"
    assert "no-such-image.tar" in missing.error["message"]
    assert broken.status.value == "failed" and broken.error is not None
    assert broken.error["code"] == "image_corrupt"
    assert str(corrupt) in broken.error["message"]
    assert broken.attempts == 2  # an infrastructure error: retried, never a reward of 0
    assert list(settings.state_dir.iterdir()) == []


async def test_a_test_patch_that_does_not_apply_names_the_task(
    instance: Instance, tmp_path: Path
) -> None:
    task = _pytest_graded(instance.task(CLASSIC))
    # A hunk against a file the repository does not have: no fuzz can apply it.
    broken_tests = (task.model_extra or {})["test_patch"] + (
        "diff --git a/tests/missing.py b/tests/missing.py\n--- a/tests/missing.py\n"
        "+++ b/tests/missing.py\n@@ -1,2 +1,2 @@\n-old\n+new\n keep\n"
    )
    broken = Task.model_validate({**task.model_dump(mode="json"), "test_patch": broken_tests})
    settings = instance.settings(tmp_path, max_attempts=1)
    [record] = await run_jobs(settings, [_submit(broken, "broken", "")])
    assert record.status.value == "failed" and record.error is not None, record.result
    assert CLASSIC in record.error["message"] and "test patch" in record.error["message"]


async def test_validating_again_on_a_kept_store_checks_again(
    instance: Instance, tmp_path: Path
) -> None:
    task = instance.task(CLASSIC)
    settings = instance.settings(tmp_path)
    [first] = await validate_tasks([task], settings, gold_only=True)
    assert first.valid, first
    broken = Task.model_validate(
        {**task.model_dump(mode="json"), "metadata": {**task.metadata, "gold_patch": "nonsense"}}
    )
    [again] = await validate_tasks([broken], settings, gold_only=True)  # same job store
    assert not again.valid
    assert again.gold is not None and again.gold.reward == 0.0
    assert "does not apply" in (again.reason or "")
