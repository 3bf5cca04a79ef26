"""The TRL rollout function's groups: from the global sample position, so that a group split
across two training processes keeps one ``group_id``; prompts that do not form groups are
refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from rollserve.client.trl import RollserveRollout, groups_of
from rollserve.errors import InvalidInputError
from rollserve.schema.api import Accepted
from rollserve.schema.jobs import JobRequest, JobView, RolloutResult
from rollserve.schema.tokens import Tokens


class FakeClient:
    """Completes every job at once with a one-token trajectory."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRequest] = {}

    def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]:
        made = [JobRequest.model_validate(r) for r in requests]
        self.jobs.update({r.job_id or "": r for r in made})
        return [Accepted(job_id=r.job_id or "", status="queued", created=True) for r in made]

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        tokens = Tokens(
            prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1.0]
        )
        result = RolloutResult(reward=1.0, exit_reason="submitted", tokens=tokens)
        group = self.jobs[job_id].group_id
        return JobView(job_id=job_id, group_id=group, status="completed", result=result)


@dataclass
class Accelerator:
    process_index: int
    num_processes: int = 2


@dataclass
class Trainer:
    accelerator: Accelerator
    num_generations: int = 4


def test_a_group_split_across_two_processes_keeps_one_group_id() -> None:
    # The global generation batch: prompts a, b, c, each 4 times; 6 per process.
    everything = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    client = FakeClient()
    groups: dict[str, list[str]] = {}
    for rank in (0, 1):
        rollout = RollserveRollout(
            client,
            lambda row: {
                "task_id": row["prompt"],
                "kind": "math",
                "prompt": row["prompt"],
                "answer": "1",
            },
            run_id="run",
        )
        mine = everything[rank * 6 : (rank + 1) * 6]
        out = rollout(mine, Trainer(Accelerator(rank)))
        assert len(out["completion_ids"]) == 6
        for job_id in out["rollserve_job_id"]:
            job = client.jobs[job_id]
            groups.setdefault(job.group_id or "", []).append(job.task.task_id)
    # b's samples 0-1 came from process 0 and 2-3 from process 1: one group, four jobs.
    assert groups == {"run-0-0": ["a"] * 4, "run-0-1": ["b"] * 4, "run-0-2": ["c"] * 4}
    assert sorted(j for j in client.jobs if j.startswith("run-0-1")) == [
        "run-0-1-0",
        "run-0-1-1",
        "run-0-1-2",
        "run-0-1-3",
    ]


def test_groups_of_positions_and_runs() -> None:
    assert groups_of(["b", "b", "c", "c", "c", "c"], 4, offset=6) == [
        (1, [(0, 2), (1, 3)]),
        (2, [(2, 0), (3, 1), (4, 2), (5, 3)]),
    ]
    assert groups_of(["x", "x", "y"], None) == [(0, [(0, 0), (1, 1)]), (1, [(2, 0)])]
    with pytest.raises(InvalidInputError, match="prompt 1 differs from prompt 0"):
        groups_of(["a", "b", "a", "a"], 4)
    with pytest.raises(InvalidInputError, match="group size must be known"):
        groups_of(["a"], None, offset=4)
