"""The TRL rollout function's decoupled mode (``prefetch=True``): the next batch in the rows'
order is submitted as soon as a batch is done, used when the trainer asks for it, and cancelled
when the trainer asks for another."""

from __future__ import annotations

from typing import Any

import pytest

from rollserve.client.trl import RollserveRollout
from rollserve.errors import InvalidInputError
from rollserve.schema.api import Accepted
from rollserve.schema.jobs import JobRequest, JobView, RolloutResult
from rollserve.schema.tokens import Tokens
from tests.unit.test_trl_groups import Accelerator, Trainer


class RecordingClient:
    """Completes every job at once; records submissions, waits and cancelled groups."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRequest] = {}
        self.events: list[tuple[str, str]] = []
        self.cancelled: list[str] = []

    def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]:
        made = [JobRequest.model_validate(r) for r in requests]
        for request in made:
            self.jobs[request.job_id or ""] = request
            self.events.append(("submit", request.job_id or ""))
        return [Accepted(job_id=r.job_id or "", status="queued", created=True) for r in made]

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        self.events.append(("wait", job_id))
        tokens = Tokens(
            prompt_ids=[1], response_ids=[2], response_mask=[1], response_logprobs=[-1.0]
        )
        result = RolloutResult(reward=1.0, exit_reason="submitted", tokens=tokens)
        group = self.jobs[job_id].group_id
        return JobView(job_id=job_id, group_id=group, status="completed", result=result)

    def cancel_group(self, group_id: str) -> list[str]:
        self.cancelled.append(group_id)
        return [j for j, r in self.jobs.items() if r.group_id == group_id]


ROWS = [{"prompt": p} for p in "abcdef"]


def rollout(client: RecordingClient, **options: Any) -> RollserveRollout:
    return RollserveRollout(
        client,
        lambda row: {"task_id": row["prompt"], "kind": "math", "prompt": "q", "answer": "1"},
        rows=ROWS,
        run_id="run",
        **options,
    )


def prompts(*names: str) -> list[str]:
    return [n for n in names for _ in range(2)]


def test_the_next_batch_is_submitted_when_a_batch_is_done_and_used_when_asked_for() -> None:
    client = RecordingClient()
    function = rollout(client, prefetch=True)
    first = function(prompts("a", "b"))
    assert [client.jobs[j].task.task_id for j in first["rollserve_job_id"]] == prompts("a", "b")
    # Every wait of the batch came before the first submission of the next one.
    last_wait = max(i for i, (kind, _) in enumerate(client.events) if kind == "wait")
    ahead = [j for kind, j in client.events if kind == "submit" and j.startswith("run-1a-")]
    assert [client.jobs[j].task.task_id for j in ahead] == prompts("c", "d")
    first_ahead = client.events.index(("submit", ahead[0]))
    assert first_ahead > last_wait
    submitted = len(client.jobs)
    second = function(prompts("c", "d"))
    assert second["rollserve_job_id"] == ahead  # the jobs generated ahead, none submitted anew
    assert function.calls[1].prefetched and not function.calls[0].prefetched
    assert len(client.jobs) == submitted + 4  # only the batch after (e, f) was added
    assert client.cancelled == []
    # The batch after the last rows wraps around to the first ones.
    function(prompts("e", "f"))
    wrapped = [r.task.task_id for j, r in client.jobs.items() if j.startswith("run-3a-")]
    assert wrapped == prompts("a", "b")


def test_a_batch_other_than_the_predicted_one_runs_at_once_and_the_guess_is_cancelled() -> None:
    client = RecordingClient()
    function = rollout(client, prefetch=True)
    function(prompts("a", "b"))
    out = function(prompts("e", "a"))
    assert [client.jobs[j].task.task_id for j in out["rollserve_job_id"]] == prompts("e", "a")
    assert all(j.startswith("run-1-") for j in out["rollserve_job_id"])
    assert client.cancelled == ["run-1a-0", "run-1a-1"]
    assert not function.calls[1].prefetched
    function.cancel()  # the end of training: the batch ahead (b, c) is cancelled too
    assert client.cancelled[2:] == ["run-2a-0", "run-2a-1"]
    function.cancel()
    assert len(client.cancelled) == 4


def test_without_prefetch_nothing_is_submitted_ahead() -> None:
    client = RecordingClient()
    function = rollout(client)
    function(prompts("a", "b"))
    assert sorted(client.jobs) == [f"run-0-{g}-{s}" for g in (0, 1) for s in (0, 1)]


def test_prefetch_refuses_several_training_processes() -> None:
    function = rollout(RecordingClient(), prefetch=True, group_size=2)
    with pytest.raises(InvalidInputError, match="one training process"):
        function(prompts("a", "b"), Trainer(Accelerator(1), num_generations=2))
