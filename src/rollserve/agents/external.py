"""The ``external`` agent: the user's own agent program, unchanged, run inside the job's
sandbox as a command. It reaches its model through the job's gateway at ``OPENAI_BASE_URL``
(a loopback port inside the sandbox's own network namespace, relayed to the node's gateway
socket: the network stays off) and finds its task in ``ROLLSERVE_TASK_FILE``.

The submission is, in order: what the agent wrote to ``ROLLSERVE_ANSWER_FILE``; the
workspace's diff, when it changed the workspace; its last reply's text."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path, PurePosixPath

from pydantic import Field, field_validator

from rollserve.agents.base import MountFields, RunContext, agent_fields
from rollserve.agents.gateway_run import GatewayRun, default_submission
from rollserve.errors import InvalidInputError
from rollserve.gateway.relay import RELAY_IN_SANDBOX, SOCKET_IN_SANDBOX, relay_binary
from rollserve.llm.toolcalls import ToolCallParser
from rollserve.registry import Registry
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import RUN_DIR, Bind, SandboxSpec
from rollserve.settings import Settings

TASK_FILE = f"{RUN_DIR}/task.md"
ANSWER_FILE = f"{RUN_DIR}/out/answer.txt"
_PROMPT_ENV_MAX = 65536  # a longer prompt is in the task file only (one variable's bound)
_ANSWER_MAX = 1024 * 1024


class ExternalSettings(MountFields):
    """The external agent's own fields of ``agent``."""

    command: list[str] = Field(min_length=1, description="the agent's argv, run in the sandbox")
    env: dict[str, str] = Field(default_factory=dict, description="added to its environment")
    cwd: str | None = Field(None, description="where it starts; default: the workspace")
    mount_at: str = Field("/opt/agent", description="where ``mount`` appears in the sandbox")
    parser: str | None = Field(
        None, description="tool-call format of the model; default: the chat template's"
    )

    @field_validator("mount_at", "cwd")
    @classmethod
    def _guest(cls, value: str | None) -> str | None:
        if value is not None and not PurePosixPath(value).is_absolute():
            raise ValueError(f"{value!r} must be an absolute path inside the sandbox")
        return value


class ExternalAgent:
    """Agent ``external``: ``{"name": "external", "command": [...], ...}``."""

    name = "external"

    def __init__(self, parsers: Registry[ToolCallParser]) -> None:
        self.parsers = parsers

    def settings(self, config: AgentConfig) -> ExternalSettings:
        own = agent_fields(ExternalSettings, config)
        if own.parser is not None:
            self.parsers.get(own.parser)
        return own

    def validate(self, config: AgentConfig) -> None:
        self.settings(config)

    def sandbox_spec(
        self, config: AgentConfig, spec: SandboxSpec, settings: Settings
    ) -> SandboxSpec:
        """The run sandbox with its run directory, the gateway's socket, the relay and the
        agent's own directory bound in."""
        own = self.settings(config)
        binds = [
            *spec.binds,
            Bind(source=settings.gateway_socket_path, target=SOCKET_IN_SANDBOX),
            Bind(source=relay_binary(settings), target=RELAY_IN_SANDBOX),
        ]
        if own.mount is not None:
            binds.append(Bind(source=own.mount, target=own.mount_at))
        return spec.model_copy(update={"run_dir": True, "binds": binds})

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput:
        own = self.settings(config)
        if sandbox is None or sandbox.run_dir is None:
            raise InvalidInputError(
                "agent 'external' runs in the task's sandbox, and this task has none",
                field="agent",
            )
        async with GatewayRun.open(context, self.parsers, own.parser) as run:
            await asyncio.to_thread(_write_task, sandbox.run_dir, context.request.task.prompt)
            argv = self._argv(own, sandbox, context, run.key)
            began = time.monotonic()
            process = asyncio.create_task(sandbox.exec(argv))
            try:
                ended_by = await run.wait(process)
            except asyncio.CancelledError:  # the run's time is up (or the job was cancelled)
                context.agent_run = run.agent_run(None, time.monotonic() - began, "timeout")
                raise
            result = process.result() if not process.cancelled() else None
            context.agent_run = run.agent_run(result, time.monotonic() - began, ended_by)
            run.sync()
            context.submission = await self._submission(sandbox, context)
            return context.output(run.exit_reason(result.exit_code if result else None))

    def _argv(
        self, own: ExternalSettings, sandbox: Sandbox, context: RunContext, key: str
    ) -> list[str]:
        """The relay's command line: it listens, sets the variables, starts the agent."""
        assert context.settings is not None
        port = context.settings.gateway_sandbox_port
        base = f"http://127.0.0.1:{port}/v1/gateway/{key}/v1"
        prompt = context.request.task.prompt
        env = {
            "OPENAI_BASE_URL": base,
            "OPENAI_API_BASE": base,
            "OPENAI_API_KEY": key,
            "ROLLSERVE_GATEWAY_URL": base,
            "ROLLSERVE_GATEWAY_SOCKET": SOCKET_IN_SANDBOX,
            "ROLLSERVE_MODEL": context.request.model or "rollserve",
            "ROLLSERVE_TASK_FILE": TASK_FILE,
            "ROLLSERVE_ANSWER_FILE": ANSWER_FILE,
            "ROLLSERVE_WORKSPACE": sandbox.guest_workspace,
            "ROLLSERVE_JOB_ID": context.job_id,
            **({"ROLLSERVE_TASK": prompt} if len(prompt.encode()) <= _PROMPT_ENV_MAX else {}),
            **own.env,
        }
        argv = [RELAY_IN_SANDBOX, str(port), SOCKET_IN_SANDBOX]
        argv += ["-C", own.cwd or sandbox.guest_workspace]
        for name, value in env.items():
            argv += ["-e", f"{name}={value}"]
        return [*argv, "--", *own.command]

    async def _submission(self, sandbox: Sandbox, context: RunContext) -> str | None:
        assert sandbox.run_dir is not None
        answer = await asyncio.to_thread(_read_answer, sandbox.run_dir / "out" / "answer.txt")
        if answer is not None:
            return answer
        return await default_submission(sandbox, context)


def _write_task(run_dir: Path, prompt: str) -> None:
    (run_dir / "task.md").write_text(prompt)


def _read_answer(path: Path) -> str | None:
    try:
        with path.open("rb") as file:
            return file.read(_ANSWER_MAX).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
