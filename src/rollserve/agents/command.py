"""The ``command`` agent: no model; one shell command run in the task's sandbox, as a reference
solution is (a Harbor task's ``solution/solve.sh``). What it changes in the sandbox is what
evaluation sees; its output is the episode's one message."""

from __future__ import annotations

from pydantic import Field, field_validator

from rollserve.agents.base import MountFields, RunContext, agent_fields
from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, ExitReason
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import Bind, SandboxSpec, check_bind_target
from rollserve.settings import Settings

_OUTPUT_KEPT = 16_000


class CommandSettings(MountFields):
    """The command agent's own fields of ``agent``."""

    command: str = Field(min_length=1, description="run with bash -c in the sandbox")
    mount_at: str = Field("/solution", description="where ``mount`` appears in the sandbox")
    timeout_s: float | None = Field(None, gt=0, description="the command at most")

    @field_validator("mount_at")
    @classmethod
    def _guest(cls, value: str) -> str:
        return check_bind_target(value)  # where the mount's bind lands


class CommandAgent:
    """``{"name": "command", "command": "bash /solution/solve.sh", "mount": DIR}``."""

    name = "command"

    def settings(self, config: AgentConfig) -> CommandSettings:
        """The agent's own fields; InvalidInputError naming the field if they are wrong."""
        return agent_fields(CommandSettings, config)

    def validate(self, config: AgentConfig) -> None:
        self.settings(config)

    def sandbox_spec(
        self, config: AgentConfig, spec: SandboxSpec, settings: Settings
    ) -> SandboxSpec:
        own = self.settings(config)
        if own.mount is None:
            return spec
        binds = [*spec.binds, Bind(source=own.mount, target=own.mount_at)]
        return spec.model_copy(update={"binds": binds})

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput:
        own = self.settings(config)
        if sandbox is None:
            raise InvalidInputError(
                "agent 'command' runs in the task's sandbox, and this task has none", field="agent"
            )
        result = await sandbox.exec(own.command, timeout=own.timeout_s)
        output = (result.stdout + result.stderr)[-_OUTPUT_KEPT:]
        status = "timed out" if result.timed_out else f"exit status {result.exit_code}"
        messages = [
            {"role": "user", "content": context.request.task.prompt},
            {"role": "assistant", "content": f"$ {own.command}\n{output}\n[{status}]"},
        ]
        reason = ExitReason.TIMEOUT if result.timed_out else ExitReason.SUBMITTED
        return RunOutput(exit_reason=reason, messages=messages)
