"""Jobs on the wire: what a trainer submits and what it gets back (DESIGN.md, Contracts)."""

from __future__ import annotations

import enum
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from rollserve.schema.sandbox import SandboxLimits, check_guest_workspace
from rollserve.schema.tokens import Tokens
from rollserve.schema.trajectory import Message, TurnLog
from rollserve.schema.wire import WireModel


class _Model(WireModel):
    pass


class SandboxRef(_Model):
    """A backend-neutral sandbox reference; omitted parts take the server's defaults."""

    backend: str | None = None
    image: str | None = None
    workspace: str | None = Field(
        None, description="a directory inside the image used as the workspace (e.g. /testbed)"
    )
    network: bool = False
    limits: SandboxLimits | None = None

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, value: str | None) -> str | None:
        return check_guest_workspace(value)


class Task(WireModel):
    """One problem. Kind-specific fields (``answer``, ``test_patch`` …) ride along and are
    validated by the task handler registered under ``kind``."""

    model_config = ConfigDict(extra="allow")

    task_id: str = Field(min_length=1, max_length=200)
    kind: str = Field(min_length=1, max_length=100, description="the task handler's name")
    prompt: str = ""
    sandbox: SandboxRef | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class AgentConfig(WireModel):
    """Which agent runs the episode, with its limits; agent-specific fields ride along."""

    model_config = ConfigDict(extra="allow")

    name: str = "tool"
    max_turns: int = Field(30, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    command_timeout_s: float = Field(120.0, gt=0)


class Sampling(_Model):
    """How the model samples. Every field is sent with every request, the neutral value when
    the job sets none, so that a server's own defaults (vLLM applies the model's
    ``generation_config.json``) never change the distribution behind the trainer's back."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="-1: off")
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    max_tokens: int | None = Field(None, ge=1, description="per turn")
    seed: int | None = Field(
        None, description="default: derived from the job id, so that each sample has its own"
    )


class StageTimeouts(_Model):
    """Active time allowed per stage; waiting in a queue never counts."""

    init_s: float | None = Field(None, gt=0)
    run_s: float | None = Field(None, gt=0)
    eval_s: float | None = Field(None, gt=0)


class JobRequest(_Model):
    """One job: a task, how to run it, and with which model."""

    job_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="client-chosen id: makes the submit idempotent",
    )
    group_id: str | None = Field(None, min_length=1, max_length=200)
    task: Task
    agent: AgentConfig | None = None
    sampling: Sampling | None = None
    model: str | None = Field(None, min_length=1, max_length=200)
    timeouts: StageTimeouts | None = None
    priority: int = 0
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="how many versions the rollout's oldest turn may lag the newest version "
        "registered for its model; beyond it the job ends as stale",
    )
    min_policy_version: int | None = Field(
        None, ge=0, description="turns run only on backends of at least this version"
    )
    metadata: dict[str, Any] = Field(default_factory=dict)


class JobStatus(enum.StrEnum):
    """The status a client sees. ``stale``: the rollout would have exceeded the job's
    ``max_staleness`` (or found no backend of ``min_policy_version``); it was not evaluated, so
    the trainer drops or resubmits it."""

    QUEUED = "queued"
    INITIALIZING = "initializing"
    RUNNING = "running"
    EVALUATING = "evaluating"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALE = "stale"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STALE})


class ExitReason(enum.StrEnum):
    """Why an episode ended."""

    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    TIMEOUT = "timeout"
    AGENT_ERROR = "agent_error"
    NO_MODEL_CALL = "no_model_call"  # an external agent ended without calling the model


class AgentRun(_Model):
    """How an agent process rollserve started ended (the external agent, a harness)."""

    exit_code: int | None = Field(None, description="None: it was killed (time or limit)")
    signal: int | None = Field(None, description="the signal that ended it, if one did")
    wall_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    output_truncated: bool = Field(False, description="its output was cut (head and tail kept)")
    ended_by: str | None = Field(
        None, description="why rollserve ended it: timeout, max_turns, max_tokens, cancelled"
    )
    model_calls: int = 0
    refused_calls: int = Field(0, description="its model calls the gateway answered with errors")


class RolloutResult(_Model):
    """The outcome of a completed job."""

    reward: float
    evaluation: dict[str, Any] = Field(default_factory=dict)
    exit_reason: ExitReason
    messages: list[Message] = Field(default_factory=list, description="OpenAI chat format")
    turn_log: list[TurnLog] = Field(
        default_factory=list,
        description="per model turn: backend, policy version, tokens, latency, and its tool runs",
    )
    turns: int = 0
    patch: str | None = None
    tokens: Tokens | None = None
    segments: list[Tokens] = Field(
        default_factory=list,
        description="every token segment in order, when there is more than one (an agent "
        "that rewrote its history); ``tokens`` is the last",
    )
    agent_run: AgentRun | None = Field(None, description="the agent process, where one ran")
    tool_errors: int = Field(0, description="malformed or failed tool calls told to the model")
    min_policy_version: int | None = Field(None, description="the oldest version of any turn")
    max_policy_version: int | None = Field(None, description="the newest version of any turn")


class JobTiming(_Model):
    """Seconds spent queued and in each stage (active time)."""

    queued_s: float = 0.0
    init_s: float = 0.0
    run_s: float = 0.0
    eval_s: float = 0.0


class JobErrorInfo(_Model):
    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class JobView(_Model):
    """A job as a client sees it."""

    job_id: str
    group_id: str | None = None
    task_id: str | None = None
    kind: str | None = Field(None, description="the task's kind")
    model: str | None = Field(None, description="the model the job asked for")
    status: str
    attempts: int = 0
    created: float | None = Field(None, description="when it was submitted (unix seconds)")
    finished: float | None = Field(None, description="when it ended (unix seconds)")
    timing: JobTiming = Field(default_factory=JobTiming)
    result: RolloutResult | None = None
    error: JobErrorInfo | None = None
