"""Durable job storage with claim / lease / heartbeat semantics."""

from rollserve.storage.base import (
    BackendStore,
    JobRecord,
    JobStatus,
    JobStore,
    NewJob,
    Stage,
    Submitted,
)
from rollserve.storage.sqlite import SqliteJobStore

__all__ = [
    "BackendStore",
    "JobRecord",
    "JobStatus",
    "JobStore",
    "NewJob",
    "SqliteJobStore",
    "Stage",
    "Submitted",
]
