"""An ``echo`` task kind and a ``script`` agent: a pipeline exercised end to end, no model.

The echo task asks for its prompt to be written to ``answer.txt`` in the workspace; the script
agent runs shell commands (``agent.commands``) in the sandbox's persistent shell and submits
what ``answer.txt`` then holds. Knobs for fault tests ride in the task: ``init_delay_s`` and
``eval_delay_s`` (slow stages), ``fail_init`` and ``fail_eval`` (how many first attempts of
that stage fail as an infrastructure error), ``crash_init`` (how many first inits raise a
plain exception, as a plug-in bug would), ``refuse_init`` (init meets an inference server's
HTTP 400).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rollserve.agents.base import RunContext
from rollserve.errors import (
    BackendRequestError,
    InvalidInputError,
    SandboxPathError,
    SandboxStartError,
)
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, ExitReason, Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.shell import ShellSession
from rollserve.tasks.base import Evaluation, SandboxOpener


class EchoHandler:
    """Task kind ``echo``: reward 1 when the submission equals the prompt."""

    name = "echo"

    def __init__(self) -> None:
        self.init_failures: dict[str, int] = {}
        self.eval_failures: dict[str, int] = {}
        self.prepared: dict[str, int] = {}  # inits that got as far as the workspace
        self.evaluating: dict[str, int] = {}  # evaluations that got as far as their sandbox
        self.evaluations = 0

    def _extra(self, task: Task) -> dict[str, Any]:
        return task.model_extra or {}

    def validate(self, task: Task) -> None:
        numbers = (
            ("init_delay_s", (int, float)),
            ("eval_delay_s", (int, float)),
            ("fail_init", int),
            ("fail_eval", int),
            ("crash_init", int),
        )
        for key, kind in numbers:
            value = self._extra(task).get(key, 0)
            if not isinstance(value, kind) or value < 0:
                raise InvalidInputError(
                    f"task.{key} must be a non-negative number", field=f"task.{key}"
                )

    def system_prompt(self, task: Task) -> str:
        return "Write the text you are given into answer.txt, then submit it."

    def tools(self, task: Task) -> list[str]:
        return ["bash", "submit"]

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        return base

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        extra = self._extra(task)
        failed = self.init_failures.get(task.task_id, 0)
        if failed < int(extra.get("fail_init", 0)) + int(extra.get("crash_init", 0)):
            self.init_failures[task.task_id] = failed + 1
            if extra.get("crash_init"):
                raise RuntimeError(f"injected plug-in bug {failed + 1}")
            raise SandboxStartError(f"injected init failure {failed + 1}")
        if extra.get("refuse_init"):
            raise BackendRequestError("injected refusal: HTTP 400", status=400)
        self.prepared[task.task_id] = self.prepared.get(task.task_id, 0) + 1
        await asyncio.sleep(float(self._extra(task).get("init_delay_s", 0)))
        await sandbox.write_file("task.txt", task.prompt.encode())

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        failed = self.eval_failures.get(task.task_id, 0)
        if failed < int(self._extra(task).get("fail_eval", 0)):
            self.eval_failures[task.task_id] = failed + 1
            raise SandboxStartError(f"injected eval failure {failed + 1}")
        async with open_sandbox() as sandbox:  # a fresh sandbox, as repository tasks use
            await sandbox.write_file("submitted.txt", (output.submission or "").encode())
            self.evaluating[task.task_id] = self.evaluating.get(task.task_id, 0) + 1
            await asyncio.sleep(float(self._extra(task).get("eval_delay_s", 0)))
            same = (await sandbox.read_file("submitted.txt")).decode() == task.prompt
        self.evaluations += 1
        return Evaluation(reward=1.0 if same else 0.0, details={"matched": same})


class ScriptAgent:
    """Agent ``script``: runs ``commands`` in order, then submits ``answer.txt``."""

    name = "script"

    def validate(self, config: AgentConfig) -> None:
        commands = (config.model_extra or {}).get("commands")
        if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
            raise InvalidInputError(
                "agent 'script' needs 'commands', a list of strings", field="agent.commands"
            )

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput:
        assert sandbox is not None
        self.validate(config)
        session = await ShellSession.open(sandbox)
        try:
            for command in (config.model_extra or {})["commands"]:
                if context.turns >= config.max_turns:
                    return context.output(ExitReason.MAX_TURNS)
                result = await session.run(command, timeout=config.command_timeout_s)
                context.turns += 1
                context.messages += [
                    {"role": "assistant", "content": command},
                    {"role": "tool", "content": result.output},
                ]
                with contextlib.suppress(SandboxPathError):  # no answer written yet
                    context.submission = (await sandbox.read_file("answer.txt")).decode()
        finally:
            await session.close()
        return context.output(ExitReason.SUBMITTED)
