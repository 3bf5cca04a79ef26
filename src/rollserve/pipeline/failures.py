"""What an exception out of a stage means for its job: an infrastructure failure (retried up
to ``max_attempts``) or an end (failed, or stale) — never a reward of 0."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from rollserve.errors import (
    BackendRequestError,
    InfrastructureError,
    InvalidInputError,
    RollserveError,
    StaleRolloutError,
)
from rollserve.storage.base import JobStatus, Stage

log = logging.getLogger(__name__)


def failure(stage: Stage, job_id: str, exc: Exception) -> tuple[RollserveError, JobStatus | None]:
    """The error to record for ``exc``, raised by ``stage`` of the job, and the status the
    job ends with: None where the failure is the infrastructure's and the job is retried."""
    if isinstance(exc, BackendRequestError):
        # A refusal the same request would get again: no retry.
        return exc, JobStatus.FAILED if exc.final else None
    if isinstance(exc, InfrastructureError):
        return exc, None
    if isinstance(exc, TimeoutError):
        return InfrastructureError(f"the {stage} stage timed out", stage=stage.value), None
    if isinstance(exc, StaleRolloutError):  # past the job's staleness bound: not evaluated
        return exc, JobStatus.STALE
    if isinstance(exc, RollserveError):  # bad input found late: not worth retrying
        return exc, JobStatus.FAILED
    if isinstance(exc, ValidationError):  # a stored request this version no longer accepts
        return InvalidInputError(f"the job's request is invalid now: {exc}"), JobStatus.FAILED
    # A bug (in a plug-in, say): an attempt, never a silent loop.
    log.error("job %s: %s stage failed unexpectedly", job_id, stage, exc_info=exc)
    crash = f"the {stage} stage failed: {type(exc).__name__}: {exc}"
    return InfrastructureError(crash, stage=stage.value), None
