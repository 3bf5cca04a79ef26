"""slime (and miles) take their samples from rollserve through a custom generate function
(``--custom-generate-function-path``): in a module of the training job,

    from rollserve.client.slime import make_generate
    generate = make_generate("http://rollserve-host:8000", model="policy")

and ``--custom-generate-function-path that_module.generate``. slime calls
``await generate(args, sample, sampling_params)`` for each sample; the function runs the
sample's task as a rollserve job (the samples of one ``group_index`` share a ``group_id``)
and fills slime's ``Sample`` in place: ``tokens`` (prompt + response ids), ``response_length``,
``loss_mask`` (0 on observations), ``rollout_log_probs``, ``reward`` (rollserve's, so slime
skips its reward model), ``status`` from how the job ended, ``weight_versions`` (one a
generation request, as slime records SGLang's) and ``response``. slime is not imported: the
function works on any object with slime's ``Sample`` fields and ``Status`` names."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from rollserve.client.http import AsyncRolloutClient
from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import AgentConfig, JobRequest, JobView, Sampling, Task

TaskBuilder = Callable[[Any], Task | dict[str, Any]]
Generate = Callable[..., Awaitable[Any]]

TASK_FIELD = "rollserve_task"
"""The ``sample.metadata`` key that holds the sample's rollserve task."""


def default_task(sample: Any) -> Task:
    """``sample.metadata["rollserve_task"]``; else a ``math`` task from the prompt (text, or
    the last user message) and ``sample.label`` (the reference answer)."""
    metadata = getattr(sample, "metadata", None) or {}
    if TASK_FIELD in metadata:
        return Task.model_validate(metadata[TASK_FIELD])
    prompt = sample.prompt
    if isinstance(prompt, list):
        users = [m["content"] for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else ""
    if not prompt or getattr(sample, "label", None) is None:
        raise InvalidInputError(
            f"a slime sample needs metadata.{TASK_FIELD} (a rollserve task), or a prompt and "
            "a label (a math task)",
            field=f"metadata.{TASK_FIELD}",
        )
    task_id = f"slime-{sample.index}" if getattr(sample, "index", None) is not None else "slime"
    return Task(task_id=task_id, kind="math", prompt=str(prompt), answer=str(sample.label))


def sampling_from(params: dict[str, Any]) -> Sampling:
    """slime's SGLang sampling parameters as rollserve's (``max_new_tokens`` per turn)."""
    fields = {k: params[k] for k in ("temperature", "top_p") if params.get(k) is not None}
    top_k = params.get("top_k")
    if top_k is not None:
        fields["top_k"] = -1 if int(top_k) <= 0 else int(top_k)
    return Sampling.model_validate({**fields, "max_tokens": params.get("max_new_tokens")})


def make_generate(
    url: str,
    *,
    model: str,
    make_task: TaskBuilder = default_task,
    agent: AgentConfig | dict[str, Any] | None = None,
    max_staleness: int | None = None,
    timeout_s: float = 3600.0,
    token: str | None = None,
) -> Generate:
    """slime's custom generate function over the rollserve server at ``url``."""
    run = uuid.uuid4().hex[:12]
    config = AgentConfig.model_validate(agent) if agent is not None else None
    clients: dict[int, AsyncRolloutClient] = {}

    async def generate(
        args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
    ) -> Any:
        loop = id(asyncio.get_running_loop())
        client = clients.get(loop) or clients.setdefault(loop, AsyncRolloutClient(url, token=token))
        group = getattr(sample, "group_index", None)
        index = getattr(sample, "index", None)
        suffix = f"{group}-{index}" if index is not None else uuid.uuid4().hex[:12]
        request = JobRequest(
            job_id=f"slime-{run}-{'eval-' if evaluation else ''}{suffix}",
            group_id=f"slime-{run}-{group}" if group is not None else None,
            task=Task.model_validate(make_task(sample)),
            agent=config,
            sampling=sampling_from(sampling_params),
            model=model,
            max_staleness=max_staleness,
        )
        accepted = await client.submit(request)
        fill_sample(sample, await client.wait(accepted.job_id, timeout=timeout_s))
        return sample

    return generate


def fill_sample(sample: Any, view: JobView) -> None:
    """Write a finished job into slime's ``Sample`` (see the module docstring)."""
    statuses = sample.Status
    result = view.result
    sample.metadata = {**(getattr(sample, "metadata", None) or {}), "rollserve_job_id": view.job_id}
    if view.status != "completed" or result is None or result.tokens is None:
        aborted = view.status in ("stale", "cancelled")
        sample.status = statuses.ABORTED if aborted else statuses.FAILED
        sample.metadata["rollserve_status"] = view.status
        if view.error is not None:
            sample.metadata["rollserve_error"] = view.error.message
        return
    tokens = result.tokens
    sample.tokens = tokens.prompt_ids + tokens.response_ids
    sample.response_length = len(tokens.response_ids)
    sample.loss_mask = list(tokens.response_mask)
    sample.rollout_log_probs = list(tokens.response_logprobs)
    sample.reward = result.reward
    sample.weight_versions = [str(v) for turn in tokens.turns for v in turn.versions]
    replies = [m.text for m in result.messages if m.role == "assistant"]
    sample.response = replies[-1] if replies else ""
    ended = result.exit_reason.value
    if ended == "submitted":
        sample.status = statuses.COMPLETED
    elif ended == "agent_error":
        sample.status = statuses.FAILED
    else:  # max_tokens, max_turns, timeout: cut, not finished
        sample.status = statuses.TRUNCATED
    sample.metadata |= {
        "rollserve_exit_reason": ended,
        "min_policy_version": result.min_policy_version,
        "max_policy_version": result.max_policy_version,
    }
