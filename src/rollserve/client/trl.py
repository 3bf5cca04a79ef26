"""A ``rollout_func`` for TRL's ``GRPOTrainer`` (TRL 1.16): the trainer's completions come
from rollserve, which runs each episode (sandbox, multi-turn agent loop, evaluation) against
the inference server that serves the trainer's current policy.

TRL hands the function the prompts of a generation batch already repeated per generation
(its sampler repeats each dataset row ``num_generations`` times, consecutively) and expects
one completion per prompt received: ``prompt_ids``, ``completion_ids`` and ``logprobs`` (one
per completion token). The adapter adds ``env_mask`` (TRL's name for rollserve's
``response_mask``: observation tokens are kept out of the loss) and, for reward functions,
``rollserve_reward`` and ``rollserve_job_id``. trl itself is never imported here: the client
stays installable without it.

With several training processes each one receives its own slice of the generation batch, and
TRL gathers the slices (in process order) before it groups them by ``num_generations``: a
group may straddle two processes. So a sample's group comes from its global position
(process index * local batch + index); the processes agree on the run id (broadcast from the
main process through accelerate) so that the halves of a group share one ``group_id``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
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

    def cancel_group(self, group_id: str) -> list[str]: ...


class RolloutCall(BaseModel):
    """What one call of the rollout function got back from rollserve (kept for reports)."""

    job_ids: list[str]
    group_ids: list[str]
    rewards: list[float]
    policy_versions: list[list[int | None]] = Field(description="each sample's per-turn versions")
    turns: list[int]
    seconds: float = Field(description="from the call to the last job finished")
    prefetched: bool = Field(False, description="generated ahead, while the trainer updated")


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
        prefetch: bool = False,
    ) -> None:
        self.client = client
        self.make_task = make_task
        self.model = model
        self.agent = AgentConfig.model_validate(agent) if agent is not None else None
        self.sampling = Sampling.model_validate(sampling) if sampling is not None else None
        self.rows = {prompt_key(r["prompt"]): r for r in rows or []}
        self.order = list(self.rows)  # the rows' keys in the dataset's order
        self.prefetch = prefetch
        self._ahead: _Ahead | None = None
        self.group_size = group_size
        self.timeout = timeout
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._run_id_given = run_id is not None
        self.calls: list[RolloutCall] = []

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        call, started = len(self.calls), time.monotonic()
        run_id = self._shared_run_id(trainer)
        size, offset = self._size(trainer), _offset(trainer, prompts)
        if self.prefetch and offset:
            raise InvalidInputError(
                "prefetch predicts the batches of one training process; turn it off with "
                "several processes",
                field="prefetch",
            )
        ahead, self._ahead = self._ahead, None
        prefetched = ahead is not None and ahead.prompts == [prompt_key(p) for p in prompts]
        if ahead is not None and not prefetched:  # a wrong guess: the batch asked for runs now
            for group_id in dict.fromkeys(ahead.group_ids):
                self.client.cancel_group(group_id)
        if ahead is not None and prefetched:
            job_ids, group_ids = ahead.job_ids, ahead.group_ids
        else:
            job_ids, group_ids = self._submit(prompts, size, offset, f"{run_id}-{call}")
        jobs = [self.client.wait(job_id, self.timeout) for job_id in job_ids]
        if self.prefetch:
            following = self._following(prompts)
            if following:
                ids, groups = self._submit(following, size, 0, f"{run_id}-{call + 1}a")
                self._ahead = _Ahead([prompt_key(p) for p in following], ids, groups)
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
                prefetched=prefetched,
            )
        )
        return out

    def cancel(self) -> None:
        """Cancel the batch submitted ahead, if any (at the end of training)."""
        ahead, self._ahead = self._ahead, None
        for group_id in dict.fromkeys(ahead.group_ids if ahead else []):
            self.client.cancel_group(group_id)

    def _submit(
        self, prompts: list[Any], size: int | None, offset: int, prefix: str
    ) -> tuple[list[str], list[str]]:
        """Submit one job per prompt; their job ids and group ids."""
        requests = []
        group_ids = []
        for group, members in groups_of(prompts, size, offset):
            group_id = f"{prefix}-{group}"
            task = self._task(prompts[members[0][0]])
            for _, sample in members:
                group_ids.append(group_id)
                requests.append(self._request(task, group_id, sample))
        accepted = self.client.submit_batch(list(requests))
        return [a.job_id for a in accepted], group_ids

    def _following(self, prompts: list[Any]) -> list[Any]:
        """The batch after ``prompts`` in the rows' order (the same number of prompts, each
        repeated as often); empty when ``prompts`` are not rows."""
        runs: list[tuple[str, int]] = []
        for prompt in prompts:
            key = prompt_key(prompt)
            if runs and runs[-1][0] == key:
                runs[-1] = (key, runs[-1][1] + 1)
            else:
                runs.append((key, 1))
        if not runs or any(key not in self.rows for key, _ in runs):
            return []
        last = self.order.index(runs[-1][0])
        following = []
        for step, (_, count) in enumerate(runs, start=1):
            row = self.rows[self.order[(last + step) % len(self.order)]]
            following += [row["prompt"]] * count
        return following

    def _shared_run_id(self, trainer: Any) -> str:
        """The run id every training process uses: the main process's, once broadcast."""
        accelerator = getattr(trainer, "accelerator", None)
        if not self._run_id_given and getattr(accelerator, "num_processes", 1) > 1:
            from accelerate.utils import broadcast_object_list

            self.run_id = broadcast_object_list([self.run_id])[0]
            self._run_id_given = True
        return self.run_id

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


@dataclass
class _Ahead:
    """A batch submitted before the trainer asked for it."""

    prompts: list[str]
    job_ids: list[str]
    group_ids: list[str]


def groups_of(
    prompts: Sequence[Any], size: int | None, offset: int = 0
) -> list[tuple[int, list[tuple[int, int]]]]:
    """The groups among ``prompts``: ``(group index, [(local index, sample in group), …])``.
    With a ``size``, a prompt's group is its global position (``offset`` + local index)
    divided by the size, so that a group may begin or end in another process's slice; its
    prompts must be equal. Without one, runs of equal consecutive prompts."""
    if size is None:
        if offset:
            raise InvalidInputError(
                "with several training processes the group size must be known: pass "
                "group_size (num_generations)",
                field="group_size",
            )
        runs: list[tuple[int, list[tuple[int, int]]]] = []
        for index, prompt in enumerate(prompts):
            if runs and prompt_key(prompts[runs[-1][1][0][0]]) == prompt_key(prompt):
                runs[-1][1].append((index, len(runs[-1][1])))
            else:
                runs.append((len(runs), [(index, 0)]))
        return runs
    groups: dict[int, list[tuple[int, int]]] = {}
    for index in range(len(prompts)):
        group, sample = divmod(offset + index, size)
        members = groups.setdefault(group, [])
        if members and prompt_key(prompts[members[0][0]]) != prompt_key(prompts[index]):
            raise InvalidInputError(
                f"the prompts do not come in runs of {size} equal prompts (num_generations): "
                f"prompt {index} differs from prompt {members[0][0]} of the same group",
                field="group_size",
            )
        members.append((index, sample))
    return sorted(groups.items())


def _offset(trainer: Any, prompts: Sequence[Any]) -> int:
    """This process's first global position: process index * local batch."""
    accelerator = getattr(trainer, "accelerator", None)
    return int(getattr(accelerator, "process_index", 0)) * len(prompts)


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
