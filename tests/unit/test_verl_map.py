"""The veRL agent loop's mapping, without veRL: rows to tasks, sampling, job to output (cut to
veRL's lengths, refused when it cannot be trained on), and one job id per sample of a group."""

from __future__ import annotations

from typing import Any

import pytest

from rollserve.client.verl_map import (
    EXTRA_FIELDS,
    output_fields,
    sampling_from,
    submit_sample,
    task_from_row,
)
from rollserve.errors import InfrastructureError, InvalidInputError, RemoteError
from rollserve.schema.api import Accepted
from rollserve.schema.jobs import JobErrorInfo, JobRequest, JobView, RolloutResult, Task
from rollserve.schema.tokens import Tokens


def test_rows_become_tasks() -> None:
    task = {"task_id": "kw", "kind": "keyword", "prompt": "p", "keywords": ["a"]}
    assert task_from_row({"extra_info": {"rollserve_task": task}}).kind == "keyword"
    math = task_from_row(
        {
            "raw_prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "6*7?"}],
            "reward_model": {"ground_truth": 42},
            "data_source": "gsm8k",
            "index": 7,
        }
    )
    assert (math.task_id, math.kind, math.prompt, math.model_extra) == (
        "gsm8k-7",
        "math",
        "6*7?",
        {"answer": "42"},
    )
    with pytest.raises(InvalidInputError, match=r"extra_info\.rollserve_task"):
        task_from_row({"raw_prompt": [{"role": "user", "content": "x"}]})


def test_sampling_maps_verl_names() -> None:
    made = sampling_from({"temperature": 0.7, "top_p": 0.9, "top_k": 0, "logprobs": True}, 64)
    assert (made.temperature, made.top_p, made.top_k, made.max_tokens) == (0.7, 0.9, -1, 64)
    assert sampling_from({"top_k": 20}, None).top_k == 20


def _view(status: str = "completed", prompt: int = 3, **result: Any) -> JobView:
    tokens = Tokens(
        prompt_ids=list(range(prompt)),
        response_ids=[10, 11, 12, 13, 14],
        response_mask=[1, 1, 0, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.5],
    )
    done = RolloutResult(
        reward=0.5,
        exit_reason="submitted",
        tokens=tokens,
        messages=[
            {"role": "system", "content": ""},
            {"role": "user", "content": ""},
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": ""},
            {"role": "assistant", "content": ""},
        ],
        min_policy_version=2,
        max_policy_version=3,
        **result,
    )
    return JobView(job_id="j", status=status, result=done if status == "completed" else None)


def test_a_job_becomes_veRLs_output_cut_to_its_lengths() -> None:
    fields = output_fields(_view(), prompt_length=8, response_length=4)
    assert fields["prompt_ids"] == [0, 1, 2]
    assert fields["response_ids"] == [10, 11, 12, 13]
    assert fields["response_mask"] == [1, 1, 0, 0]
    assert fields["response_logprobs"] == [-0.1, -0.2, 0.0, 0.0]
    assert fields["reward_score"] == 0.5 and fields["num_turns"] == 4
    assert tuple(fields["extra_fields"]) == EXTRA_FIELDS
    assert fields["extra_fields"]["min_global_steps"] == 2
    assert fields["extra_fields"]["max_global_steps"] == 3


def test_jobs_a_trainer_must_not_train_on_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="prompt has 9 tokens, more than"):
        output_fields(_view(prompt=9), prompt_length=8, response_length=4)
    stale = JobView(job_id="s", status="stale", error=JobErrorInfo(code="stale", message="too old"))
    with pytest.raises(InfrastructureError, match=r"did not complete \(stale\)"):
        output_fields(stale, prompt_length=8, response_length=4)


class Slots:
    """A server where slot 0 of the group is taken by an identical request and slot 1 by
    another request."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    async def submit(self, request: JobRequest | dict[str, Any]) -> Accepted:
        assert isinstance(request, JobRequest) and request.job_id is not None
        self.tried.append(request.job_id)
        if request.job_id.endswith("-1"):
            raise RemoteError(409, "job_conflict", "another request")
        return Accepted(job_id=request.job_id, status="queued", created=request.job_id[-1] != "0")


async def test_each_sample_of_a_group_gets_its_own_job_id() -> None:
    server = Slots()
    task = Task(task_id="t", kind="math")
    job_id = await submit_sample(server, JobRequest(task=task, group_id="g"), "g")
    assert job_id == "verl-g-2" and server.tried == ["verl-g-0", "verl-g-1", "verl-g-2"]
