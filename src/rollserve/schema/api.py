"""Request and response bodies of the HTTP API v1 beyond jobs themselves."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rollserve.schema.jobs import JobRequest, JobView
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
