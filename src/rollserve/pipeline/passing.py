"""Jobs a node's stage passed on to a free worker of the next stage (``Store.pass_on``), or
claimed for the idle workers of a stage together (``Store.claim_many``): leased to the node,
each waiting for one of its workers of that stage, which takes it before it claims anything
from the store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rollserve.storage.base import JobRecord, Stage


class PassedJobs:
    """The jobs passed on and not yet taken, and the pass_on calls under way, per stage."""

    def __init__(self, stages: list[Stage]) -> None:
        self._waiting: dict[Stage, dict[str, JobRecord]] = {stage: {} for stage in stages}
        self._under_way = dict.fromkeys(stages, 0)

    def spoken_for(self, stage: Stage) -> int:
        """Workers of ``stage`` that a job passed on (or being passed on) will take."""
        return len(self._waiting[stage]) + self._under_way[stage]

    @contextmanager
    def passing(self, stage: Stage) -> Iterator[None]:
        """A pass_on call to ``stage`` under way: a worker is spoken for from now on."""
        self._under_way[stage] += 1
        try:
            yield
        finally:
            self._under_way[stage] -= 1

    def add(self, stage: Stage, job: JobRecord) -> None:
        self._waiting[stage][job.job_id] = job

    def first(self, stage: Stage) -> JobRecord | None:
        """The job passed on to ``stage`` first, taken; None if there is none."""
        waiting = self._waiting[stage]
        return waiting.pop(next(iter(waiting))) if waiting else None

    def take(self, job_id: str) -> bool:
        """Take the job out, if it was passed on and waits; whether it did."""
        return any(waiting.pop(job_id, None) is not None for waiting in self._waiting.values())

    def ids(self) -> list[str]:
        """Every job passed on and waiting: leased to this node, its heartbeat renews them."""
        return [job_id for waiting in self._waiting.values() for job_id in waiting]

    def clear(self) -> None:
        for waiting in self._waiting.values():
            waiting.clear()
