"""What the stores share about a job's row: turning it into a JobRecord, merging timings."""

from __future__ import annotations

from typing import Any

from rollserve.storage.base import JobRecord, JobStatus, Stage

JSON_COLUMNS = ("request", "stage_output", "result", "error", "timing")


def to_record(row: dict[str, Any]) -> JobRecord:
    """A job's row, its JSON columns already decoded, as a JobRecord."""
    data = {key: value for key, value in row.items() if key != "seq"}
    data["timing"] = data["timing"] or {}
    data["stage"] = Stage(data["stage"])
    data["status"] = JobStatus(data["status"])
    data["cancel_requested"] = bool(data["cancel_requested"])
    return JobRecord(**data)


def merged_timing(
    stored: dict[str, float] | None, timing: dict[str, float] | None
) -> dict[str, float]:
    """A stage's timings added to those of the stages before."""
    return {**(stored or {}), **(timing or {})}
