"""The ``harbor`` task kind: an operating-system task in Harbor's format (terminal-bench 2,
SkyRL), imported from its directory by ``rollserve tasks import harbor``.

The agent works in the task's image with its whole filesystem writable. What it wrote anywhere
(``/etc``, ``/opt``, a service's files) is kept as a layer when its sandbox closes; the
verifier runs in a fresh sandbox of the image with that layer laid over it, the task's
``tests/`` copied in afresh at ``/tests`` (whatever the agent left there is replaced), and
``bash /tests/test.sh`` writes the reward to ``/logs/verifier/reward.txt`` (or
``reward.json``), as Harbor's verifier reads it."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import Bind, SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener, kind_fields

STAGED_TESTS = "/run/harbor-tests"  # the task's tests/, bound read-only, copied to /tests
LOGS = "/logs/verifier"
OUTPUT_TAIL = 8000

SYSTEM_PROMPT = (
    "You are working in a Linux container as root. Complete the task the user describes using "
    "the bash tool (and the editor tool for files); everything you change anywhere in the "
    "filesystem stays for the checks that follow. When you are done, call the submit tool."
)


class HarborFields(BaseModel):
    """The kind-specific fields of a ``harbor`` task (from its task.toml and directory)."""

    model_config = ConfigDict(extra="forbid")

    task_dir: Path = Field(description="the task's directory: tests/ and solution/ are read here")
    verifier_timeout_s: float = Field(600.0, gt=0, description="test.sh at most")
    verifier_env: dict[str, str] = Field(default_factory=dict, description="test.sh's extras")
    agent_timeout_s: float | None = Field(None, gt=0, description="the run stage at most")
    solution_env: dict[str, str] = Field(default_factory=dict, description="solve.sh's extras")
    env: dict[str, str] = Field(default_factory=dict, description="the environment's variables")
    cpus: float | None = Field(None, description="task.toml's cpus (not enforced: no CPU limit)")

    @field_validator("task_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value


class HarborHandler:
    """Task kind ``harbor``: the reward test.sh writes, for the state the agent left."""

    name = "harbor"

    def fields(self, task: Task) -> HarborFields:
        """The kind-specific fields; InvalidInputError naming the field if they are wrong."""
        return kind_fields(HarborFields, task)

    def validate(self, task: Task) -> None:
        fields = self.fields(task)
        if task.sandbox is None or not task.sandbox.image:
            raise InvalidInputError(
                "task.sandbox.image: a harbor task runs in its environment's image "
                "(task.toml's docker_image, or `tasks import harbor --image-template`)",
                field="task.sandbox.image",
            )
        if not (fields.task_dir / "tests" / "test.sh").is_file():
            raise InvalidInputError(
                f"task.task_dir: {fields.task_dir} has no tests/test.sh", field="task.task_dir"
            )

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT

    def tools(self, task: Task) -> list[str]:
        return ["bash", "editor", "submit"]

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        env = {**base.env, **self.fields(task).env}
        return base.model_copy(update={"writable_root": True, "env": env})

    def stage_timeouts(self, task: Task) -> dict[str, float]:
        """task.toml's timeouts, where the job sets none: the agent's run, the verifier's
        evaluation (with room for the sandbox's start)."""
        fields = self.fields(task)
        timeouts = {"eval_s": fields.verifier_timeout_s + 60.0}
        if fields.agent_timeout_s is not None:
            timeouts["run_s"] = fields.agent_timeout_s
        return timeouts

    def reference_agents(self, task: Task) -> dict[str, AgentConfig]:
        """What `tasks validate` runs: solution/solve.sh (the full reward expected), and
        nothing at all (0 expected)."""
        fields = self.fields(task)
        solution = fields.task_dir / "solution"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fields.solution_env.items())
        command = f"{env} bash /solution/solve.sh".strip()
        gold = {"name": "command", "command": command, "mount": str(solution)}
        empty = {"name": "submit", "submission": ""}
        return {
            "gold": AgentConfig.model_validate(gold),
            "empty": AgentConfig.model_validate(empty),
        }

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        return None  # the image is the task's environment

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        fields = self.fields(task)
        tests = Bind(source=fields.task_dir / "tests", target=STAGED_TESTS)
        async with open_sandbox(binds=[tests]) as sandbox:
            staged = await sandbox.exec(
                f"rm -rf /tests && cp -a {STAGED_TESTS} /tests && rm -rf {LOGS} && mkdir -p {LOGS}",
                timeout=120,
            )
            if staged.exit_code != 0:
                return _scored(0.0, "the tests could not be copied in", staged.stderr)
            env = [f"{k}={v}" for k, v in fields.verifier_env.items()]
            result = await sandbox.exec(
                ["env", *env, "bash", "/tests/test.sh"], timeout=fields.verifier_timeout_s
            )
            log = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
            if result.timed_out:
                reason = f"test.sh timed out after {fields.verifier_timeout_s:g}s"
                return _scored(0.0, reason, log)
            found = await sandbox.exec(
                f"cat {LOGS}/reward.txt 2>/dev/null || cat {LOGS}/reward.json", timeout=30
            )
        reward, rewards, problem = _reward(found.stdout if found.exit_code == 0 else None)
        details: dict[str, Any] = {
            "verifier": "harbor tests/test.sh",
            "exit_code": result.exit_code,
            "test_output": log,
        }
        if rewards:
            details["rewards"] = rewards
        if problem is not None:
            details["reason"] = problem
        return Evaluation(reward=reward, details=details)


def _reward(text: str | None) -> tuple[float, dict[str, float], str | None]:
    """The reward test.sh wrote (reward.txt: one number; reward.json: ``reward`` or its one
    value), every value of reward.json, and why there is none (0 then)."""
    if text is None or not text.strip():
        return 0.0, {}, f"test.sh wrote no reward ({LOGS}/reward.txt or reward.json)"
    try:
        value = float(text.strip())
    except ValueError:
        pass
    else:
        return (value, {}, None) if math.isfinite(value) else (0.0, {}, f"reward {text!r}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return 0.0, {}, f"the reward file holds neither a number nor JSON: {text[:200]!r}"
    if not isinstance(data, dict):
        return 0.0, {}, "reward.json is not an object"
    rewards = {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
    if "reward" in rewards:
        return rewards["reward"], rewards, None
    if len(rewards) == 1:
        return next(iter(rewards.values())), rewards, None
    return 0.0, rewards, "reward.json has no 'reward' and more than one value"


def _scored(reward: float, reason: str, output: str) -> Evaluation:
    details = {"verifier": "harbor tests/test.sh", "reason": reason, "test_output": output}
    return Evaluation(reward=reward, details=details)
