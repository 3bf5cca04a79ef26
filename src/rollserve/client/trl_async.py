"""A rollout worker for TRL's experimental ``AsyncGRPOTrainer`` (TRL 1.16,
``trl.experimental.async_grpo``) served by rollserve: ``rollout_worker=RollserveRolloutWorker(
url, make_task, rows, model=..., group_size=...)``.

The worker keeps ``groups_in_flight`` groups of ``group_size`` jobs running on rollserve (one
dataset row a group, rows in turn). When a group's jobs are done it scores the group the way
TRL's own worker does (advantage ``(r - mean) / (std + 1e-8)``, population std) and puts one
``RolloutSample`` a job into ``rollout_buffer``: ``input_ids`` = prompt + response ids,
``completion_mask`` = 0 on the prompt and on observations, ``old_log_probs`` aligned with
``input_ids``, and ``model_version`` = the oldest policy version of the job's turns (the
trainer drops samples more than its ``max_staleness`` behind). ``update_model_version``
also sets the version of the model's rollserve backends (``publish_versions``), so that turns
are tagged with the trainer's versions. Jobs that end ``stale`` or ``failed`` never become
samples; a group with fewer than two samples is dropped (no advantage). trl and numpy are
imported only when samples are made."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from rollserve.client.grpo import group_advantages, group_stats
from rollserve.client.http import AsyncRolloutClient
from rollserve.errors import RollserveError
from rollserve.schema.jobs import AgentConfig, JobRequest, JobView, Sampling, Task

log = logging.getLogger(__name__)

TaskBuilder = Callable[[dict[str, Any]], Task | dict[str, Any]]


class RollserveRolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` over a rollserve server (see the module docstring)."""

    def __init__(
        self,
        url: str,
        make_task: TaskBuilder,
        rows: Sequence[dict[str, Any]],
        *,
        model: str,
        group_size: int,
        agent: AgentConfig | dict[str, Any] | None = None,
        sampling: Sampling | dict[str, Any] | None = None,
        groups_in_flight: int = 4,
        max_staleness: int | None = None,
        publish_versions: bool = True,
        token: str | None = None,
        run_id: str | None = None,
    ) -> None:
        if group_size < 2:
            raise ValueError("group_size must be at least 2: GRPO compares samples of a group")
        self.url, self.token, self.model = url, token, model
        self.make_task, self.rows, self.group_size = make_task, list(rows), group_size
        self.agent = AgentConfig.model_validate(agent) if agent is not None else None
        self.sampling = Sampling.model_validate(sampling) if sampling is not None else None
        self.groups_in_flight, self.max_staleness = groups_in_flight, max_staleness
        self.publish_versions = publish_versions
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.rollout_buffer: queue.Queue[Any] = queue.Queue()
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.model_version = 0
        self.groups_done = 0
        self._published = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_sample = time.monotonic()

    # -- RolloutWorkerProtocol ------------------------------------------------------------------

    def start(self) -> None:
        """Start submitting groups (TRL calls it after its first weight sync)."""
        self._stop.clear()
        self._last_sample = time.monotonic()
        self._thread = threading.Thread(target=self._main, name="rollserve-rollouts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop: the groups still running are cancelled on the server."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def update_model_version(self, model_version: int) -> None:
        """The trainer synced its weights: later groups carry ``model_version``."""
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        """Raise when the worker died, or produced nothing for ``stale_after_s``."""
        if self._error is not None:
            raise RuntimeError(
                f"the rollserve rollout worker failed: {self._error}"
            ) from self._error
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the rollserve rollout worker is not running")
        idle = time.monotonic() - self._last_sample
        if idle > stale_after_s:
            raise RuntimeError(f"the rollserve rollout worker made no sample in {idle:.0f}s")

    # -- the loop -------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as exc:  # kept for check_health, which raises it in the trainer
            log.exception("the rollserve rollout worker failed")
            self._error = exc

    async def _loop(self) -> None:
        async with AsyncRolloutClient(self.url, token=self.token) as client:
            serials = itertools.count()
            running: set[asyncio.Task[None]] = set()
            try:
                while not self._stop.is_set():
                    await self._publish(client)
                    while len(running) < self.groups_in_flight:
                        serial = next(serials)
                        row = self.rows[serial % len(self.rows)]
                        running.add(asyncio.create_task(self._group(client, serial, row)))
                    done, running = await asyncio.wait(
                        running, timeout=0.2, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        task.result()
            finally:
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
                await self._publish(client)  # the last sync, too

    async def _publish(self, client: AsyncRolloutClient) -> None:
        version = self.model_version
        if self.publish_versions and version != self._published:
            await client.resume_model(self.model, policy_version=version)
            self._published = version

    async def _group(self, client: AsyncRolloutClient, serial: int, row: dict[str, Any]) -> None:
        group_id = f"{self.run_id}-{serial}"
        task = Task.model_validate(self.make_task(row))
        requests: list[JobRequest | dict[str, Any]] = [
            JobRequest(
                job_id=f"{group_id}-{k}",
                group_id=group_id,
                task=task,
                agent=self.agent,
                sampling=self.sampling,
                model=self.model,
                max_staleness=self.max_staleness,
            )
            for k in range(self.group_size)
        ]
        version = self.model_version
        try:
            accepted = await client.submit_batch(requests)
            views = [await client.wait(a.job_id) for a in accepted]
        except asyncio.CancelledError:
            # Best effort: the worker is stopping; jobs it cannot cancel finish unread.
            with contextlib.suppress(RollserveError, httpx.HTTPError):
                await asyncio.shield(client.cancel_group(group_id))
            raise
        usable = [v for v in views if _usable(v)]
        self.metrics_queue.put(
            {
                "rollserve/groups_total": 1.0,
                "rollserve/stale_total": float(sum(v.status == "stale" for v in views)),
                "rollserve/failed_total": float(sum(v.status == "failed" for v in views)),
            }
        )
        if len(usable) < 2:
            return
        rewards = [v.result.reward for v in usable if v.result is not None]
        mean, std = group_stats(rewards, population=True)
        advantages = group_advantages(rewards, eps=1e-8, population=True)
        for view, advantage in zip(usable, advantages, strict=True):
            self.rollout_buffer.put(_sample(view, advantage, serial, version))
        self.groups_done += 1
        self._last_sample = time.monotonic()
        self.metrics_queue.put({"rollserve/reward": mean, "rollserve/reward_std": std})


def _usable(view: JobView) -> bool:
    result = view.result
    return (
        view.status == "completed"
        and result is not None
        and result.tokens is not None
        and bool(result.tokens.response_ids)
    )


def _sample(view: JobView, advantage: float, group: int, version: int) -> Any:
    """One job as TRL's ``RolloutSample``."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    result = view.result
    assert result is not None and result.tokens is not None
    tokens = result.tokens
    context = [0] * len(tokens.prompt_ids)
    generated = result.min_policy_version
    prompt = [m.model_dump() for m in result.messages if m.role in ("system", "user")][:2]
    completion = [m.model_dump() for m in result.messages if m.role == "assistant"]
    return RolloutSample(
        prompt=prompt,
        completion=completion,
        input_ids=np.array(tokens.prompt_ids + tokens.response_ids, dtype=np.int64),
        completion_mask=np.array(context + tokens.response_mask, dtype=np.int64),
        old_log_probs=np.array([0.0] * len(context) + tokens.response_logprobs, dtype=np.float32),
        advantage=float(advantage),
        model_version=generated if generated is not None else version,
        group_id=group,
        metrics={"reward": result.reward},
        enqueued_at=time.time(),
    )
