"""The agent Protocol: drives one episode in a sandbox and reports how it ended."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollserve.errors import InvalidInputError
from rollserve.gateway.keys import Gateway
from rollserve.llm.session import ModelSession
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, AgentRun, ExitReason, JobRequest
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.schema.tokens import Tokens, TurnInfo
from rollserve.schema.trajectory import TurnLog
from rollserve.settings import Settings

# Told of the episode as it goes: once with the messages before the first turn (``turn`` 0),
# then once per model turn with its messages and log. The run stage appends them to the store.
TurnHook = Callable[[int, list[dict[str, Any]], TurnLog | None], Awaitable[None]]


@dataclass
class RunContext:
    """What an episode may use besides its sandbox, and where it leaves its partial progress:
    an episode cut off by its time limit is evaluated on what it recorded here."""

    request: JobRequest
    llm: ModelSession | None = None  # the rollout's model, when the server has backends
    system_prompt: str = ""  # the task family's instructions
    tools: list[str] = field(default_factory=list)  # the task family's tool names
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    submission: str | None = None
    tokens: Tokens | None = None  # token mode: the trajectory so far (its last segment)
    segments: list[Tokens] = field(default_factory=list)  # every segment, ``tokens`` among them
    agent_run: AgentRun | None = None  # the agent process, where one ran
    tool_errors: int = 0  # malformed or failed tool calls, told to the model
    turn_log: list[TurnLog] = field(default_factory=list)  # one per model turn
    on_turn: TurnHook | None = None
    started: float = field(default_factory=time.monotonic)
    job_id: str = ""
    gateway: Gateway | None = None  # the node's gateway, for agents rollserve serves through it
    settings: Settings | None = None

    def begin_turn(self, info: TurnInfo, started_s: float) -> TurnLog:
        """Count a model turn and start its log (``started_s``: when its model call began,
        in seconds since the episode started)."""
        self.turns += 1
        log = TurnLog(turn=self.turns, started_s=started_s, info=info)
        self.turn_log.append(log)
        return log

    async def told(self, turn: int, messages: list[dict[str, Any]], log: TurnLog | None) -> None:
        """Tell the hook of a turn (0: the messages before the first)."""
        if self.on_turn is not None:
            await self.on_turn(turn, messages, log)

    def output(self, exit_reason: ExitReason) -> RunOutput:
        """The episode as it stands, ended for ``exit_reason``."""
        segments = self.segments if len(self.segments) > 1 else []
        return RunOutput(
            exit_reason=exit_reason,
            submission=self.submission,
            messages=self.messages,
            turns=self.turns,
            tokens=self.tokens.model_dump() if self.tokens is not None else None,
            tool_errors=self.tool_errors,
            turn_log=[log.model_dump(mode="json") for log in self.turn_log],
            policy_versions=list(self.llm.versions) if self.llm is not None else [],
            segments=[segment.model_dump() for segment in segments],
            agent_run=self.agent_run.model_dump() if self.agent_run is not None else None,
        )


@runtime_checkable
class ShapesSandbox(Protocol):
    """An agent that needs something in its run sandbox (an agent process's door to the
    gateway): it adds to the spec before the sandbox starts."""

    def sandbox_spec(
        self, config: AgentConfig, spec: SandboxSpec, settings: Settings
    ) -> SandboxSpec: ...


class Agent(Protocol):
    """An agent, registered under its ``name`` (the ``agent.name`` of a job)."""

    name: str

    def validate(self, config: AgentConfig) -> None:
        """Raise InvalidInputError naming the field when the agent's settings are wrong."""
        ...

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput: ...


FieldsT = TypeVar("FieldsT", bound=BaseModel)


def agent_fields(model: type[FieldsT], config: AgentConfig) -> FieldsT:
    """An agent's own fields of ``agent`` as ``model``; InvalidInputError naming the field
    when they are wrong."""
    try:
        return model.model_validate(config.model_extra or {})
    except ValidationError as exc:
        problem = exc.errors()[0]
        name = ".".join(str(p) for p in problem["loc"]) or "?"
        message = str(problem["msg"]).removeprefix("Value error, ")
        raise InvalidInputError(f"agent.{name}: {message}", field=f"agent.{name}") from exc


class MountFields(BaseModel):
    """An agent's host directory bound read-only into its sandbox (its code, a solution)."""

    model_config = ConfigDict(extra="forbid")

    mount: Path | None = Field(None, description="a host directory bound read-only")

    @field_validator("mount")
    @classmethod
    def _mount(cls, value: Path | None) -> Path | None:
        if value is not None and (not value.is_absolute() or not value.is_dir()):
            raise ValueError(f"{value} is not an existing absolute directory")
        return value
