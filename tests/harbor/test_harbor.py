"""Harbor task directories through ``tasks import harbor`` and the pipeline: the agent's run
sandbox has its whole filesystem writable, its layer is laid under the verifier's sandbox with
the tests copied in afresh, and test.sh's reward (reward.txt or reward.json) is the job's;
``tasks validate`` runs solution/solve.sh (full reward) and nothing (0)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollserve.node import default_plugins
from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import AgentConfig, JobRequest, Task
from rollserve.tasks.harbor_import import import_dirs
from tests.conformance.conftest import require
from tests.harbor.conftest import SERVICE, SYSTEM_FILES, TASKS, Harbor
from tests.integration.conftest import Server, scripted_job, tool_call
from tests.leaks import mounts_under
from tests.swebench.conftest import run_jobs, validate_command

CONFIGURE = "printf 'port=8089\\nreply=pong\\n' > /etc/svc.conf"


def _tasks(harbor: Harbor) -> dict[str, Task]:
    lines = (harbor.tasks_dir / "tasks.jsonl").read_text().splitlines()
    return {t.task_id: t for t in (Task.model_validate_json(line) for line in lines)}


def _command(task: Task, job_id: str, command: str) -> JobRequest:
    agent = AgentConfig.model_validate({"name": "command", "command": command})
    return JobRequest(job_id=job_id, task=task, agent=agent)


def test_task_toml_becomes_the_jobs_limits(harbor: Harbor) -> None:
    task = _tasks(harbor)[SYSTEM_FILES]
    assert task.kind == "harbor"
    assert task.prompt.startswith("Set this machine's message of the day")
    assert task.sandbox is not None and task.sandbox.limits is not None
    assert (task.sandbox.limits.memory_mb, task.sandbox.limits.disk_mb) == (1024, 2048)
    assert task.sandbox.network is False
    handler = default_plugins().handlers.get("harbor")
    assert handler.stage_timeouts(task) == {"run_s": 300.0, "eval_s": 120.0}  # type: ignore[attr-defined]
    assert task.metadata["category"] == "system-administration"
    service = _tasks(harbor)[SERVICE]
    assert (service.model_extra or {})["verifier_env"] == {"SVC_PORT": "8089"}
    report = json.loads((harbor.tasks_dir / "report.json").read_text())
    [notes] = [r["notes"] for r in report["tasks"] if r["task_id"] == SYSTEM_FILES]
    assert notes == ["cpus = 1 is not enforced (no CPU limit)"]


def test_directories_that_cannot_be_tasks_say_why(tmp_path: Path) -> None:
    def task_dir(name: str, toml: str, files: dict[str, str]) -> Path:
        folder = tmp_path / "set" / name
        for path, text in {"task.toml": toml, **files}.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
        return folder

    ok = {"instruction.md": "do it", "tests/test.sh": "echo 1 > /logs/verifier/reward.txt"}
    task_dir("prebuilt", '[environment]\ndocker_image = "ghcr.io/o/t:1"\n', ok)
    task_dir("no-image", "[environment]\ncpus = 2\n", ok)
    task_dir("no-tests", '[environment]\ndocker_image = "x"\n', {"instruction.md": "x"})
    task_dir("steps", '[[steps]]\nname = "a"\n', ok)
    task_dir("bad-size", '[environment]\ndocker_image = "x"\nmemory = "lots"\n', ok)
    reports = {Path(r.dir).name: r for r in import_dirs([tmp_path / "set"], tmp_path / "out")}
    assert reports["prebuilt"].valid and reports["prebuilt"].image == "docker://ghcr.io/o/t:1"
    assert "no prebuilt image" in (reports["no-image"].reason or "")
    assert "docker build" in (reports["no-image"].reason or "")  # how to make one
    assert "tests/test.sh is missing" in (reports["no-tests"].reason or "")
    assert "multi-step" in (reports["steps"].reason or "")
    assert "'lots' is not a size" in (reports["bad-size"].reason or "")
    lines = (tmp_path / "out" / "tasks.jsonl").read_text().splitlines()
    assert [Task.model_validate_json(line).task_id for line in lines] == ["prebuilt"]


def test_validate_runs_the_solution_and_nothing(harbor: Harbor, tmp_path: Path) -> None:
    done = validate_command(harbor.tasks_dir, tmp_path, harbor.cache, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((harbor.tasks_dir / "validation.json").read_text())
    checks = {c["task_id"]: c for c in report["tasks"]}
    assert set(checks) == {SYSTEM_FILES, SERVICE}
    for check in checks.values():
        assert check["valid"], check
        assert (check["gold"]["reward"], check["empty"]["reward"]) == (1.0, 0.0)
    assert list((tmp_path / "sandboxes").iterdir()) == []
    assert not (tmp_path / "layers").exists() or list((tmp_path / "layers").iterdir()) == []


async def test_the_verifier_sees_the_whole_filesystem_and_fresh_tests(
    harbor: Harbor, tmp_path: Path
) -> None:
    tasks = _tasks(harbor)
    solve = (TASKS / "system-files" / "solution" / "solve.sh").read_text()
    tamper = (
        "mkdir -p /tests /logs/verifier && printf '#!/bin/bash\\necho 1 > "
        "/logs/verifier/reward.txt\\n' > /tests/test.sh && echo 1 > /logs/verifier/reward.txt"
    )
    half = "echo 'hello from rollserve' > /etc/motd"  # /opt left out: the check fails
    settings = harbor.settings(tmp_path)
    solved, tampered, partial, service = await run_jobs(
        settings,
        [
            _command(tasks[SYSTEM_FILES], "solved", solve),
            _command(tasks[SYSTEM_FILES], "tampered", tamper),
            _command(tasks[SYSTEM_FILES], "partial", half),
            _command(
                tasks[SERVICE], "service", "printf 'port=8089\\nreply=pong\\n' > /etc/svc.conf"
            ),
        ],
    )
    results: dict[str, dict[str, Any]] = {}
    for record in (solved, tampered, partial, service):
        assert record.status.value == "completed" and record.result is not None, record.error
        results[record.job_id] = record.result
    assert results["solved"]["reward"] == 1.0, results["solved"]["evaluation"]
    assert results["tampered"]["reward"] == 0.0  # its own test.sh and reward were replaced
    assert "motd is wrong" in results["tampered"]["evaluation"]["test_output"]
    assert results["partial"]["reward"] == 0.0
    assert "greet is wrong" in results["partial"]["evaluation"]["test_output"]
    evaluation = results["service"]["evaluation"]
    assert results["service"]["reward"] == 1.0, evaluation
    assert evaluation["rewards"] == {"reward": 1.0, "answered": 1.0}  # reward.json
    assert list(settings.state_dir.iterdir()) == []
    assert list((settings.data_dir / "layers").iterdir()) == []  # dropped as each job ended
    assert mounts_under(settings.data_dir) == []


async def test_the_reward_file_missing_scores_zero_with_the_reason(
    harbor: Harbor, tmp_path: Path
) -> None:
    task = _tasks(harbor)[SYSTEM_FILES]
    broken = Task.model_validate(
        {**task.model_dump(mode="json"), "task_dir": str(_copy_without_reward(tmp_path))}
    )
    [record] = await run_jobs(harbor.settings(tmp_path), [_command(broken, "broken", "true")])
    assert record.result is not None
    assert record.result["reward"] == 0.0
    assert "test.sh wrote no reward" in record.result["evaluation"]["reason"]


def _copy_without_reward(tmp_path: Path) -> Path:
    folder = tmp_path / "task"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho checked\n")
    return folder


async def test_a_harbor_task_runs_on_apptainer_too(harbor: Harbor, tmp_path: Path) -> None:
    settings = harbor.settings(tmp_path)
    require(SandboxManager(settings), "apptainer")
    task = _tasks(harbor)[SYSTEM_FILES]
    body = task.model_dump(mode="json")
    body["sandbox"]["backend"] = "apptainer"
    solve = (TASKS / "system-files" / "solution" / "solve.sh").read_text()
    [record] = await run_jobs(settings, [_command(Task.model_validate(body), "app", solve)])
    assert record.result is not None, record.error
    assert record.result["reward"] == 1.0, record.result["evaluation"]
    assert list(settings.state_dir.iterdir()) == []


def test_a_scripted_agent_does_the_task_through_the_server(
    server_factory: Callable[..., Server], harbor: Harbor
) -> None:
    # The tool agent, driven by the scripted model server, works anywhere in the filesystem:
    # a shell command, the editor on a file outside the working directory, then submit.
    task = _tasks(harbor)[SYSTEM_FILES]
    greet = '#!/bin/sh\necho "hi $1"\n'
    turns = [
        tool_call("bash", command="pwd && echo 'hello from rollserve' > /etc/motd"),
        tool_call("editor", command="create", path="/opt/greeting/bin/greet", file_text=greet),
        tool_call("bash", command="chmod +x /opt/greeting/bin/greet && greet() { :; }"),
        tool_call("submit"),
    ]
    server = server_factory(image_cache_dir=str(harbor.cache))
    server.start()
    done = scripted_job(server, turns, task, wait=300)
    assert done["status"] == "completed", done
    result = done["result"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["exit_reason"] == "submitted"
    assert "/app" in json.dumps(result["messages"])  # the shell started in the WORKDIR
    assert result["patch"] is None  # the filesystem is the outcome, not a diff
