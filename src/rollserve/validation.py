"""``rollserve tasks validate``: every task's gold patch (expect reward 1) and an empty patch
(expect 0) run through the real pipeline — the check a team runs before training on a new data
set, which finds rows whose image, tests or patches are broken."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from rollserve.errors import RollserveError
from rollserve.node import build_node, default_plugins
from rollserve.plugins import Plugins
from rollserve.schema.jobs import AgentConfig, JobRequest, Task
from rollserve.settings import Settings
from rollserve.storage import JobRecord
from rollserve.tasks.base import HasReferenceAgents

_WAIT_S = 30.0


class PatchCheck(BaseModel):
    """One patch of one task through the pipeline."""

    expected: float
    status: str = "missing"
    reward: float | None = None
    reason: str | None = None
    seconds: float = 0.0
    grader: str | None = None  # what graded it: the evaluation's harness, and its spec
    fail_to_pass: dict[str, str] = Field(default_factory=dict)  # each test's status
    pass_to_pass: dict[str, str] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "completed" and self.reward == self.expected


class TaskCheck(BaseModel):
    """A task's verdict: valid when the gold patch scores 1 and the empty patch 0."""

    task_id: str
    valid: bool = False
    gold: PatchCheck | None = None
    empty: PatchCheck | None = None
    reason: str | None = None


def read_tasks(path: Path) -> list[Task]:
    """The tasks of ``DIR/tasks.jsonl`` (or of a JSONL file)."""
    file = path / "tasks.jsonl" if path.is_dir() else path
    return [Task.model_validate_json(line) for line in file.read_text().splitlines() if line]


def _agents(task: Task, handler: object) -> dict[str, AgentConfig] | None:
    """The agents of the task's gold and empty runs: its kind's own, or the submit agent with
    ``metadata.gold_patch`` and with nothing (None: the task has no gold patch)."""
    if isinstance(handler, HasReferenceAgents):
        return handler.reference_agents(task)
    if not isinstance(task.metadata.get("gold_patch"), str):
        return None
    patches = {"gold": str(task.metadata["gold_patch"]), "empty": ""}
    return {
        which: AgentConfig.model_validate({"name": "submit", "submission": patch})
        for which, patch in patches.items()
    }


def _requests(
    task: Task, agents: dict[str, AgentConfig], gold_only: bool, run: str
) -> dict[str, JobRequest]:
    return {
        which: JobRequest(job_id=f"validate:{run}:{task.task_id}:{which}", task=task, agent=agent)
        for which, agent in agents.items()
        if which == "gold" or not gold_only
    }


def _check(record: JobRecord, expected: float) -> PatchCheck:
    check = PatchCheck(expected=expected, status=record.status.value)
    check.seconds = round(sum(record.timing.values()), 2)
    result, error = record.rollout_result(), record.error_info()
    if result is not None:
        check.reward = result.reward
        evaluation = result.evaluation
        check.reason = evaluation.get("reason") or evaluation.get("error")
        if isinstance(evaluation.get("harness"), str):
            spec = evaluation.get("harness_spec")
            check.grader = evaluation["harness"] + (f"; {spec}" if spec else "")
        for name in ("fail_to_pass", "pass_to_pass"):
            if isinstance(statuses := evaluation.get(name), dict):
                setattr(check, name, {str(k): str(v) for k, v in statuses.items()})
    elif error is not None:
        check.reason = f"[{error.code}] {error.message}"
    return check


async def validate_tasks(
    tasks: list[Task],
    settings: Settings,
    *,
    gold_only: bool = False,
    on_done: Callable[[TaskCheck], None] | None = None,
    plugins: Plugins | None = None,
) -> list[TaskCheck]:
    """Run the checks of every task at once (the pipeline's pools bound the parallelism);
    ``on_done`` hears of each task as soon as its checks are in. ``plugins``: the built-in
    ones by default."""
    checks = {t.task_id: TaskCheck(task_id=t.task_id) for t in tasks}
    run = secrets.token_hex(4)  # a fresh job id per run: a kept job store never answers stale
    wanted: dict[str, tuple[str, str, float]] = {}
    requests: list[JobRequest] = []
    plugins = plugins or default_plugins()
    for task in tasks:
        try:
            agents = _agents(task, plugins.handlers.get(task.kind))
        except RollserveError as exc:  # an unknown kind, fields its kind refuses
            checks[task.task_id].reason = exc.message
            continue
        if agents is None:
            checks[task.task_id].reason = "no metadata.gold_patch to check"
            continue
        for which, request in _requests(task, agents, gold_only, run).items():
            assert request.job_id is not None
            wanted[request.job_id] = (task.task_id, which, 1.0 if which == "gold" else 0.0)
            requests.append(request)
    service = build_node(settings, plugins)

    async def settle(job_id: str) -> None:
        record = await service.wait(job_id, _WAIT_S)
        while not record.status.terminal:
            record = await service.wait(job_id, _WAIT_S)
        task_id, which, expected = wanted[job_id]
        check = checks[task_id]
        setattr(check, which, _check(record, expected))
        if on_done is not None and check.gold is not None and (gold_only or check.empty):
            on_done(_verdict(check))

    await service.start()
    try:
        for request in requests:
            try:
                await service.submit([request])
            except RollserveError as exc:  # bad input: the task's own fault, reported with it
                task_id, _, _ = wanted.pop(request.job_id or "")
                checks[task_id].reason = exc.message
        await asyncio.gather(*(settle(job_id) for job_id in wanted))
    finally:
        await service.stop()
    return [_verdict(checks[t.task_id]) for t in tasks]


def _verdict(check: TaskCheck) -> TaskCheck:
    """Set ``valid`` (and the reason when it is not) from the checks that are in."""
    parts = [p for p in (check.gold, check.empty) if p is not None]
    check.valid = check.reason is None and bool(parts) and all(p.ok for p in parts)
    if not check.valid and check.reason is None:
        bad = [p for p in parts if not p.ok]
        check.reason = "; ".join(_why(p) for p in bad) or "not checked"
    return check


def _why(check: PatchCheck) -> str:
    name = "gold patch" if check.expected == 1.0 else "empty patch"
    if check.status != "completed":
        return f"{name}: {check.status} ({check.reason})"
    return f"{name}: reward {check.reward:g}, expected {check.expected:g}" + (
        f" ({check.reason})" if check.reason else ""
    )


def write_report(path: Path, checks: list[TaskCheck], started: float) -> None:
    """``validation.json`` beside the tasks."""
    body = {
        "seconds": round(time.time() - started, 1),
        "valid": sum(c.valid for c in checks),
        "tasks": [c.model_dump(mode="json") for c in checks],
    }
    path.write_text(json.dumps(body, indent=2) + "\n")
