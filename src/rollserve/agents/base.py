"""The agent Protocol: drives one episode in a sandbox and reports how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, JobRequest
from rollserve.tasks.base import RunOutput


@dataclass
class RunContext:
    """What an episode may use besides its sandbox, and where it leaves its partial progress:
    an episode cut off by its time limit is evaluated on what it recorded here."""

    request: JobRequest
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    submission: str | None = None


class Agent(Protocol):
    """An agent, registered under its ``name`` (the ``agent.name`` of a job)."""

    name: str

    def validate(self, config: AgentConfig) -> None:
        """Raise InvalidInputError naming the field when the agent's settings are wrong."""
        ...

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput: ...
