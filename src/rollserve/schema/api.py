"""Request and response bodies of the HTTP API v1 beyond jobs themselves."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rollserve.schema.jobs import JobRequest, JobView


class Accepted(BaseModel):
    """One submitted job: its id, status, and whether this submit created it."""

    job_id: str
    status: str
    created: bool


class BatchRequest(BaseModel):
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
