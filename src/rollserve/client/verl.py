"""veRL (0.9) trains through rollserve: ``RollserveAgentLoop`` is a veRL agent loop whose
``run`` submits the dataset row's task to rollserve (the sample's ``uid`` is the GRPO
``group_id``), waits for the job and returns veRL's ``AgentLoopOutput``: the token-exact
trajectory cut to the configured prompt and response lengths, rollserve's reward, and the
policy versions as ``min/max_global_steps``. This module imports veRL; the mapping itself
lives in ``verl_map`` and the trainer-side ``VerlServers`` registers veRL's rollout servers.

Register it with an agent-loop config file (``actor_rollout_ref.rollout.agent.
agent_loop_config_path``), which also reaches veRL's Ray workers::

    - name: rollserve
      _target_: rollserve.client.verl.RollserveAgentLoop
      rollserve_url: http://rollserve-host:8000
      model: policy

and choose it with ``actor_rollout_ref.rollout.agent.default_agent_loop=rollserve`` (or a
dataset column ``agent_name``). Importing this module also registers it by name."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rollserve.client.http import AsyncRolloutClient
from rollserve.client.verl_map import (
    VerlServers,
    output_fields,
    plain,
    sampling_from,
    submit_sample,
    task_from_row,
)
from rollserve.schema.jobs import AgentConfig, JobRequest

__all__ = ["RollserveAgentLoop", "VerlServers"]


@register("rollserve")
class RollserveAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """A veRL agent loop served by rollserve. Config keys: ``rollserve_url``, ``model`` (the
    registered model name), optional ``agent`` (rollserve's agent config; default: the task
    kind's tool agent with the trajectory budget prompt_length + response_length),
    ``max_staleness``, ``timeout_s``, ``token``."""

    _clients: ClassVar[dict[tuple[str, str | None, int], AsyncRolloutClient]] = {}

    def __init__(
        self,
        *args: Any,
        rollserve_url: str,
        model: str,
        agent: Any = None,
        max_staleness: int | None = None,
        timeout_s: float = 3600.0,
        token: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.url, self.model, self.token, self.timeout_s = rollserve_url, model, token, timeout_s
        self.max_staleness = max_staleness
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        budget = {"max_tokens": self.prompt_length + self.response_length}
        self.agent = AgentConfig.model_validate({**budget, **(plain(agent) or {})})

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = task_from_row(kwargs)
        group_id = str(kwargs.get("uid") or task.task_id)
        request = JobRequest(
            group_id=group_id,
            task=task,
            agent=self.agent,
            sampling=sampling_from(sampling_params, self.response_length),
            model=self.model,
            max_staleness=self.max_staleness,
        )
        client = self._client()
        job_id = await submit_sample(client, request, group_id)
        view = await client.wait(job_id, timeout=self.timeout_s)
        return AgentLoopOutput(**output_fields(view, self.prompt_length, self.response_length))

    def _client(self) -> AsyncRolloutClient:
        """One client per server and event loop, shared by the loop's samples (veRL makes an
        agent loop object per sample)."""
        key = (self.url, self.token, id(asyncio.get_running_loop()))
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = AsyncRolloutClient(self.url, token=self.token)
        return client
