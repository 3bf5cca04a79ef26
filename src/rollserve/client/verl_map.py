"""The mapping between veRL's agent loop and rollserve, without veRL itself (so that it is
testable anywhere): a dataset row's fields → a rollserve task, veRL's sampling parameters →
rollserve's, and a finished job → the fields of veRL's ``AgentLoopOutput``, cut to veRL's
configured prompt and response lengths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from rollserve.client.http import RolloutClient
from rollserve.errors import InfrastructureError, InvalidInputError, RemoteError
from rollserve.schema.api import Accepted
from rollserve.schema.backends import BackendSpec, BackendView
from rollserve.schema.jobs import JobRequest, JobView, Sampling, Task

TASK_FIELD = "rollserve_task"
"""The ``extra_info`` key of a dataset row that holds its rollserve task."""

EXTRA_FIELDS = (
    "turn_scores",
    "tool_rewards",
    "min_global_steps",
    "max_global_steps",
    "rollserve_job_id",
    "rollserve_exit_reason",
)
"""The ``extra_fields`` every output carries (veRL requires one key set across a batch)."""


def task_from_row(row: Mapping[str, Any]) -> Task:
    """The task of a veRL dataset row (the keyword arguments of ``run``): the task in
    ``extra_info["rollserve_task"]``; else a ``math`` task from the row's last user message
    and ``reward_model.ground_truth`` (veRL's math datasets)."""
    extra = plain(row.get("extra_info")) or {}
    if isinstance(extra, dict) and TASK_FIELD in extra:
        return Task.model_validate(extra[TASK_FIELD])
    truth = (plain(row.get("reward_model")) or {}).get("ground_truth")
    messages = [m for m in plain(row.get("raw_prompt")) or [] if isinstance(m, dict)]
    users = [m for m in messages if m.get("role") == "user"]
    if truth is None or not users:
        raise InvalidInputError(
            f"a veRL row needs extra_info.{TASK_FIELD} (a rollserve task), or a user message "
            "and reward_model.ground_truth (a math task)",
            field=f"extra_info.{TASK_FIELD}",
        )
    index = row.get("index")
    task_id = f"{row.get('data_source') or 'verl'}-{index if index is not None else 'row'}"
    return Task.model_validate(
        {"task_id": task_id, "kind": "math", "prompt": users[-1]["content"], "answer": str(truth)}
    )


def sampling_from(params: Mapping[str, Any], max_tokens: int | None) -> Sampling:
    """veRL's sampling parameters (temperature, top_p, top_k, repetition_penalty) as
    rollserve's; ``max_tokens`` caps each turn."""
    fields = {k: params[k] for k in ("temperature", "top_p", "repetition_penalty") if k in params}
    top_k = params.get("top_k")
    if top_k is not None:
        fields["top_k"] = -1 if int(top_k) <= 0 else int(top_k)
    return Sampling.model_validate({**fields, "max_tokens": max_tokens})


def output_fields(view: JobView, prompt_length: int, response_length: int) -> dict[str, Any]:
    """A finished job as the fields of veRL's ``AgentLoopOutput``: the response (ids, mask,
    logprobs) keeps its first ``response_length`` tokens; the reward is rollserve's; the
    versions ride along as veRL's ``min/max_global_steps``. A job that did not complete in
    token mode, or whose prompt is longer than ``prompt_length``, raises: a trainer must not
    train on a made-up sample, nor on one conditioned on a cut prompt."""
    result = view.result
    if view.status != "completed" or result is None:
        error = f": [{view.error.code}] {view.error.message}" if view.error else ""
        raise InfrastructureError(
            f"rollout job {view.job_id} did not complete ({view.status}){error}",
            job_id=view.job_id,
            status=view.status,
        )
    tokens = result.tokens
    if tokens is None:
        raise InvalidInputError(
            f"rollout job {view.job_id} has no token ids: register the rollout servers as "
            "vllm backends with a tokenizer (token mode)",
            job_id=view.job_id,
        )
    if len(tokens.prompt_ids) > prompt_length:
        raise InvalidInputError(
            f"rollout job {view.job_id}: its prompt has {len(tokens.prompt_ids)} tokens, more "
            f"than veRL's rollout.prompt_length={prompt_length}; raise prompt_length",
            job_id=view.job_id,
        )
    turns = [m for m in result.messages if m.role in ("user", "assistant", "tool")]
    return {
        "prompt_ids": tokens.prompt_ids,
        "response_ids": tokens.response_ids[:response_length],
        "response_mask": tokens.response_mask[:response_length],
        "response_logprobs": tokens.response_logprobs[:response_length],
        "reward_score": result.reward,
        "num_turns": len(turns),
        "metrics": {
            "generate_sequences": view.timing.run_s,
            "compute_score": view.timing.eval_s,
        },
        "extra_fields": {
            "turn_scores": [],
            "tool_rewards": [],
            "min_global_steps": result.min_policy_version,
            "max_global_steps": result.max_policy_version,
            "rollserve_job_id": view.job_id,
            "rollserve_exit_reason": result.exit_reason.value,
        },
    }


def plain(value: Any) -> Any:
    """numpy arrays and OmegaConf containers (as veRL passes them) as plain lists and dicts."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, list):
        value = value.tolist()
    if isinstance(value, list | tuple) or hasattr(value, "__iter__"):
        return [plain(v) for v in value]
    return value


class Submitter(Protocol):
    """What ``submit_sample`` needs of an ``AsyncRolloutClient``."""

    async def submit(self, request: JobRequest | dict[str, Any]) -> Accepted: ...


async def submit_sample(client: Submitter, request: JobRequest, group_id: str) -> str:
    """Submit one sample of ``group_id`` under the first free job id ``verl-{group}-{k}``.
    veRL gives the samples of a group one ``uid`` and nothing that tells them apart, and they
    may run in different agent-loop workers: an id another sample took (the server answers
    that it knew it, or that it names another request) moves this one to the next ``k``."""
    for slot in range(_MAX_SLOTS):
        job_id = f"verl-{group_id}-{slot}"
        try:
            accepted = await client.submit(request.model_copy(update={"job_id": job_id}))
        except RemoteError as exc:
            if exc.remote_code == "job_conflict":
                continue
            raise
        if accepted.created:
            return job_id
    raise InvalidInputError(f"group {group_id!r} has {_MAX_SLOTS} samples already", field="uid")


class VerlServers:
    """The trainer side: veRL's rollout servers (``trainer.llm_server_manager.get_addresses()``,
    ``host:port``) as rollserve ``vllm`` backends in token mode, versioned by the training step.
    ``publish`` after each weight update, ``suspend`` before the servers sleep or change."""

    def __init__(self, client: RolloutClient, model: str, tokenizer: str) -> None:
        self.client = client
        self.model = model
        self.tokenizer = tokenizer

    def publish(self, addresses: list[str], step: int) -> list[BackendView]:
        """Register every server with ``policy_version=step`` and resume the model."""
        views = [
            self.client.register_backend(
                BackendSpec(
                    id=f"verl-{index}",
                    kind="vllm",
                    url=f"http://{address}/v1",
                    model=self.model,
                    tokenizer=self.tokenizer,
                    policy_version=step,
                )
            )
            for index, address in enumerate(addresses)
        ]
        self.client.resume_model(self.model, policy_version=step)
        return views

    def suspend(self) -> None:
        """Pause the model: its turns wait (nothing is ejected) until the next ``publish``."""
        self.client.pause_model(self.model, "wait")


_MAX_SLOTS = 100_000
