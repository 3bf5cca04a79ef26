"""Request and response bodies of the HTTP API v1 beyond jobs themselves."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from rollserve.schema.jobs import (
    AgentRun,
    ExitReason,
    JobErrorInfo,
    JobRequest,
    JobStatus,
    JobTiming,
    JobView,
)
from rollserve.schema.tokens import Tokens
from rollserve.schema.trajectory import Message, Turn
from rollserve.schema.wire import WireModel


class Accepted(BaseModel):
    """One submitted job: its id, status, and whether this submit created it."""

    job_id: str
    status: str
    created: bool


class BatchRequest(WireModel):
    jobs: list[JobRequest] = Field(min_length=1)


class BatchAccepted(BaseModel):
    jobs: list[Accepted]


class ResultsPage(BaseModel):
    """Finished jobs in completion order; ``next`` is the cursor for the following page."""

    results: list[JobView]
    next: int


class GroupCancelled(BaseModel):
    group_id: str
    cancelled: list[str]


class ErrorDetail(BaseModel):
    """What went wrong: a stable code, a sentence, and details (fields, ids)."""

    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    """Every error the API answers: ``{"error": {code, message, details}}``."""

    error: ErrorDetail


SortField = Literal["created", "updated", "finished", "reward", "policy_version"]


class JobQuery(WireModel):
    """``GET /v1/jobs``: which jobs (every filter given must hold), in which order, which page."""

    status: list[JobStatus] = Field(default_factory=list, description="any of these")
    group_id: str | None = Field(None, min_length=1, max_length=200)
    kind: str | None = Field(None, min_length=1, max_length=100)
    exit_reason: list[ExitReason] = Field(default_factory=list, description="any of these")
    reward_min: float | None = Field(None, allow_inf_nan=False)
    reward_max: float | None = Field(None, allow_inf_nan=False)
    policy_version_min: int | None = Field(None, ge=0, le=2**62)
    policy_version_max: int | None = Field(None, ge=0, le=2**62)
    created_after: float | None = Field(None, ge=0, le=1e11, description="unix seconds")
    created_before: float | None = Field(None, ge=0, le=1e11, description="unix seconds")
    sort: SortField = "created"
    order: Literal["asc", "desc"] = "desc"
    offset: int = Field(0, ge=0, le=10_000_000)
    limit: int = Field(50, ge=1, le=500)


class JobSummary(BaseModel):
    """One row of the jobs table: what a job is and how it ended, without its trajectory."""

    job_id: str
    group_id: str | None = None
    task_id: str | None = None
    kind: str | None = None
    model: str | None = None
    status: str
    attempts: int = 0
    reward: float | None = None
    exit_reason: str | None = None
    policy_version: int | None = Field(None, description="the newest version of any turn")
    turns: int | None = None
    error_code: str | None = None
    created: float
    updated: float
    finished: float | None = None
    timing: JobTiming = Field(default_factory=JobTiming)


class JobsPage(BaseModel):
    """A page of jobs; ``total`` counts every job the filters match."""

    jobs: list[JobSummary]
    total: int
    offset: int
    limit: int


class Trajectory(BaseModel):
    """One job's rollout turn by turn (``GET /v1/jobs/{job_id}/trajectory``). A job still
    running (``live``) shows the turns its episode has recorded so far."""

    job_id: str
    group_id: str | None = None
    status: str
    attempts: int = 0
    live: bool = Field(False, description="the turns come from a running episode's events")
    task_id: str | None = None
    kind: str | None = None
    model: str | None = None
    created: float | None = None
    finished: float | None = None
    timing: JobTiming = Field(default_factory=JobTiming)
    reward: float | None = None
    exit_reason: str | None = None
    evaluation: dict[str, Any] = Field(default_factory=dict)
    patch: str | None = None
    tool_errors: int = 0
    error: JobErrorInfo | None = None
    prelude: list[Message] = Field(default_factory=list, description="system and task messages")
    turns: list[Turn] = Field(default_factory=list)
    tokens: Tokens | None = None
    token_text: list[str] | None = Field(
        None, description="each token of prompt_ids + response_ids as text, when known"
    )
    segments: list[Tokens] = Field(
        default_factory=list,
        description="every token segment in order, when there is more than one; ``tokens`` "
        "is the last",
    )
    segment_text: list[list[str]] | None = Field(
        None, description="each segment's tokens as text, as ``token_text`` for ``tokens``"
    )
    agent_run: AgentRun | None = Field(None, description="the agent process, where one ran")
