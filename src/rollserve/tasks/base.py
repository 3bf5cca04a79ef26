"""The task handler Protocol: how a kind of task is set up in a sandbox and scored."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec

FieldsT = TypeVar("FieldsT", bound=BaseModel)

# Opens a fresh sandbox of the task's spec for evaluation (with extra binds, where given),
# closed when the block ends; over the run's kept layer where the run had a writable root.
SandboxOpener = Callable[..., AbstractAsyncContextManager[Sandbox]]


@dataclass
class Evaluation:
    """A score and what it rests on (tests passed/failed, verifier output)."""

    reward: float
    details: dict[str, Any] = field(default_factory=dict)
    patch: str | None = None  # the patch that was scored, for tasks on a repository


class TaskHandler(Protocol):
    """A kind of task (``swe``, ``math``, ``code`` …), registered under its ``name``."""

    name: str

    def validate(self, task: Task) -> None:
        """Raise InvalidInputError naming the field when kind-specific fields are wrong."""
        ...

    def system_prompt(self, task: Task) -> str:
        """The instructions the tool agent gives the model for this kind of task."""
        ...

    def tools(self, task: Task) -> list[str]:
        """The tool agent's tools for this kind of task (``bash``, ``submit`` …)."""
        ...

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        """The run sandbox (``base`` holds the server's defaults and the task's own
        choices); None when the task needs no sandbox."""
        ...

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        """Lay out the workspace before the agent starts."""
        ...

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        """Score the run; a fresh sandbox comes from ``open_sandbox`` when one is needed.
        An agent's submission that breaks the evaluation scores 0 with the reason; only a
        failure of rollserve's own machinery raises (an InfrastructureError)."""
        ...


def kind_fields(model: type[FieldsT], task: Task) -> FieldsT:
    """A task's kind-specific fields as ``model``; InvalidInputError naming the field when
    they are wrong."""
    try:
        return model.model_validate(task.model_extra or {})
    except ValidationError as exc:
        problem = exc.errors()[0]
        name = ".".join(str(p) for p in problem["loc"]) or "?"
        raise InvalidInputError(f"task.{name}: {problem['msg']}", field=f"task.{name}") from exc


def jsonable(value: Any) -> bool:
    """Whether ``value`` can go into a task as JSON (a row's column kept in its metadata)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


@runtime_checkable
class HasStageTimeouts(Protocol):
    """A task kind whose tasks carry their own stage time limits (``init_s``, ``run_s``,
    ``eval_s``), used where the job sets none."""

    def stage_timeouts(self, task: Task) -> dict[str, float]: ...


@runtime_checkable
class HasReferenceAgents(Protocol):
    """A task kind that says how `tasks validate` checks a task: the agents of its ``gold``
    run (full reward expected) and ``empty`` run (0 expected), instead of submitting
    ``metadata.gold_patch`` and an empty submission."""

    def reference_agents(self, task: Task) -> dict[str, AgentConfig]: ...
