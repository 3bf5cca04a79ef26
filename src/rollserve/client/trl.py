"""A ``rollout_func`` for TRL's ``GRPOTrainer`` (TRL 1.16): the trainer's completions come
from rollserve, which runs each episode (sandbox, multi-turn agent loop, evaluation) against
the inference server that serves the trainer's current policy.

TRL hands the function the prompts of a generation batch already repeated per generation
(its sampler repeats each dataset row ``num_generations`` times, consecutively) and expects
one completion per prompt received: ``prompt_ids``, ``completion_ids`` and ``logprobs`` (one
per completion token). The adapter adds ``env_mask`` (TRL's name for rollserve's
``response_mask``: observation tokens are kept out of the loss) and, for reward functions,
``rollserve_reward`` and ``rollserve_job_id``. trl itself is never imported here: the client
stays installable without it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from rollserve.errors import InfrastructureError, InvalidInputError
from rollserve.schema.api import Accepted
from rollserve.schema.jobs import AgentConfig, JobRequest, JobView, RolloutResult, Sampling, Task

TaskBuilder = Callable[[dict[str, Any]], Task | dict[str, Any]]


class RolloutSink(Protocol):
    """What the adapter needs of a ``RolloutClient``."""

    def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]: ...

    def wait(self, job_id: str, timeout: float | None = None) -> JobView: ...


class RolloutCall(BaseModel):
    """What one call of the rollout function got back from rollserve (kept for reports)."""

    job_ids: list[str]
    group_ids: list[str]
    rewards: list[float]
    policy_versions: list[list[int | None]] = Field(description="each sample's per-turn versions")
    turns: list[int]
    seconds: float = Field(description="from submitting the jobs to the last one finished")


def rollserve_reward(
    completions: list[Any], rollserve_reward: list[float], **kwargs: Any
) -> list[float | None]:
    """A TRL reward function that returns the rewards rollserve's evaluation gave (typed as
    TRL's ``RewardFunc``, whose rewards may be None)."""
    return [float(r) for r in rollserve_reward]


def prompt_key(prompt: Any) -> str:
    """A dataset prompt (text or chat messages) as a lookup key."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class RollserveRollout:
    """``rollout_func=RollserveRollout(client, make_task, model=...)``: one rollserve job per
    prompt received; the samples of one prompt share a ``group_id``.

    ``make_task`` builds the task from the dataset row of the prompt (the row whose ``prompt``
    it is, when ``rows`` are given; else ``{"prompt": prompt}``). ``group_size`` defaults to the
    trainer's ``num_generations`` (``num_generations_eval`` when evaluating). A job that does
    not complete, or completes without token ids, raises: a trainer must not train on made-up
    samples."""

    def __init__(
        self,
        client: RolloutSink,
        make_task: TaskBuilder,
        *,
        model: str | None = None,
        agent: AgentConfig | dict[str, Any] | None = None,
        sampling: Sampling | dict[str, Any] | None = None,
        rows: Iterable[dict[str, Any]] | None = None,
        group_size: int | None = None,
        timeout: float | None = None,
        run_id: str | None = None,
    ) -> None:
        self.client = client
        self.make_task = make_task
        self.model = model
        self.agent = AgentConfig.model_validate(agent) if agent is not None else None
        self.sampling = Sampling.model_validate(sampling) if sampling is not None else None
        self.rows = {prompt_key(r["prompt"]): r for r in rows or []}
        self.group_size = group_size
        self.timeout = timeout
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.calls: list[RolloutCall] = []

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        call, started = len(self.calls), time.monotonic()
        requests = []
        group_ids = []
        for index, (start, size) in enumerate(groups_of(prompts, self._size(trainer))):
            group_id = f"{self.run_id}-{call}-{index}"
            task = self._task(prompts[start])
            for sample in range(size):
                group_ids.append(group_id)
                requests.append(self._request(task, group_id, sample))
        accepted = self.client.submit_batch(list(requests))
        jobs = [self.client.wait(a.job_id, self.timeout) for a in accepted]
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "rollserve_reward": [],
            "rollserve_job_id": [],
        }
        versions: list[list[int | None]] = []
        turns: list[int] = []
        for job in jobs:
            result = _completed(job)
            tokens = result.tokens
            assert tokens is not None
            out["prompt_ids"].append(tokens.prompt_ids)
            out["completion_ids"].append(tokens.response_ids)
            out["logprobs"].append(tokens.response_logprobs)
            out["env_mask"].append(tokens.response_mask)
            out["rollserve_reward"].append(result.reward)
            out["rollserve_job_id"].append(job.job_id)
            versions.append([t.policy_version for t in tokens.turns])
            turns.append(result.turns)
        self.calls.append(
            RolloutCall(
                job_ids=out["rollserve_job_id"],
                group_ids=group_ids,
                rewards=out["rollserve_reward"],
                policy_versions=versions,
                turns=turns,
                seconds=time.monotonic() - started,
            )
        )
        return out

    def _size(self, trainer: Any) -> int | None:
        if self.group_size is not None or trainer is None:
            return self.group_size
        model = getattr(trainer, "model", None)
        evaluating = model is not None and not getattr(model, "training", True)
        size = getattr(trainer, "num_generations_eval" if evaluating else "num_generations", None)
        return size if isinstance(size, int) and size > 0 else None

    def _task(self, prompt: Any) -> Task:
        row = self.rows.get(prompt_key(prompt), {"prompt": prompt})
        return Task.model_validate(self.make_task(row))

    def _request(self, task: Task, group_id: str, sample: int) -> JobRequest:
        return JobRequest(
            job_id=f"{group_id}-{sample}",  # a retried call resubmits the same jobs, idempotently
            group_id=group_id,
            task=task,
            agent=self.agent,
            sampling=self.sampling,
            model=self.model,
        )


def groups_of(prompts: Sequence[Any], size: int | None) -> list[tuple[int, int]]:
    """``(start, length)`` of each group: runs of equal consecutive prompts, cut every
    ``size`` prompts when a size is given (the same prompt may be drawn twice in a row)."""
    groups: list[tuple[int, int]] = []
    for index, prompt in enumerate(prompts):
        if groups:
            start, length = groups[-1]
            same = prompt_key(prompts[start]) == prompt_key(prompt)
            if same and (size is None or length < size):
                groups[-1] = (start, length + 1)
                continue
        groups.append((index, 1))
    if size is not None and any(length != size for _, length in groups):
        raise InvalidInputError(
            f"the prompts do not come in runs of {size} equal prompts (num_generations): "
            f"got runs of {[length for _, length in groups]}",
            field="group_size",
        )
    return groups


def _completed(job: JobView) -> RolloutResult:
    """The result of a completed token-mode job; otherwise an error naming the job."""
    if job.status != "completed" or job.result is None:
        error = f": [{job.error.code}] {job.error.message}" if job.error else ""
        raise InfrastructureError(
            f"rollout job {job.job_id} did not complete ({job.status}){error}", job_id=job.job_id
        )
    if job.result.tokens is None or not job.result.tokens.response_ids:
        raise InvalidInputError(
            f"rollout job {job.job_id} has no token ids: register the policy's server as a "
            "vllm or sglang backend with a tokenizer (token mode)",
            job_id=job.job_id,
        )
    return job.result
