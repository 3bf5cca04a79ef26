"""One rollserve node assembled for a benchmark, in a temporary data directory: the SQLite job
store, the sandbox manager, the real Router with the scripted model registered, the stage
runner with the ``echo`` task and the tool agent, and — for pipelined runs — the Scheduler.

A benchmark either submits jobs to the scheduler (what ``RolloutService.submit`` does:
validate, store, wake the init pool) or calls the StageRunner's stages itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from rollserve.bench.model import ModelScript, ScriptedToolBackend, ScriptedToolFactory
from rollserve.errors import BackendUnavailableError
from rollserve.llm.base import LLMBackend
from rollserve.llm.templates import TemplateCache
from rollserve.node import build_node, default_plugins
from rollserve.pipeline.scheduler import Scheduler
from rollserve.pipeline.stages import validate
from rollserve.schema.backends import BackendSpec, BackendView
from rollserve.schema.jobs import TERMINAL, JobRequest
from rollserve.settings import Settings
from rollserve.storage import JobRecord, NewJob
from rollserve.testing.pipeline import EchoHandler, ScriptAgent

MODEL = "bench-model"


def echo_job(
    index: int,
    *,
    turns: int,
    init_delay_s: float = 0.0,
    eval_delay_s: float = 0.0,
    backend: str = "bwrap",
) -> JobRequest:
    """Rollout ``index``: an ``echo`` task for the tool agent, ``turns`` model calls long."""
    prompt = f"rollout-{index}"
    return JobRequest.model_validate(
        {
            "job_id": prompt,
            "task": {
                "task_id": prompt,
                "kind": "echo",
                "prompt": prompt,
                "init_delay_s": init_delay_s,
                "eval_delay_s": eval_delay_s,
                "sandbox": {"backend": backend},
            },
            "agent": {"name": "tool", "max_turns": turns, "command_timeout_s": 60.0},
            "model": MODEL,
        }
    )


class Sampler:
    """The largest value ``probe`` returned, probed every ``interval_s`` while running."""

    def __init__(self, probe: Callable[[], int], interval_s: float = 0.02) -> None:
        self.probe = probe
        self.interval_s = interval_s
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            self.peak = max(self.peak, self.probe())
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> int:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.peak = max(self.peak, self.probe())
        return self.peak


class Rig:
    """The node's parts; ``async with`` builds and tears them down."""

    def __init__(
        self,
        script: ModelScript,
        *,
        init_workers: int = 1,
        run_workers: int = 1,
        eval_workers: int = 1,
        **settings: Any,
    ) -> None:
        self.script = script
        self._root = Path(tempfile.mkdtemp(prefix="rollserve-bench-"))
        self.settings = Settings(
            data_dir=self._root / "data",
            init_workers=init_workers,
            run_workers=run_workers,
            eval_workers=eval_workers,
            max_attempts=1,  # an infrastructure failure must show as an error, not a retry
            llm_health_interval_s=3600.0,
            **settings,
        )
        self._factory = ScriptedToolFactory(script)
        plugins = default_plugins()
        plugins.handlers.register(EchoHandler.name, EchoHandler())
        plugins.agents.register(ScriptAgent.name, ScriptAgent())
        plugins.llm_kinds.register("openai", self._scripted, replace=True)
        self.plugins = plugins
        node = build_node(self.settings, plugins)
        self.store = node.store
        self.sandboxes = node.sandboxes
        self.router = node.router
        self.runner = node.scheduler.runner
        self.scheduler: Scheduler | None = None

    def _scripted(
        self, view: BackendView, settings: Settings, templates: TemplateCache
    ) -> LLMBackend:
        return self._factory(view, settings)

    @property
    def model(self) -> ScriptedToolBackend:
        """The registered scripted model."""
        return self._factory.backend

    async def __aenter__(self) -> Rig:
        await self.sandboxes.__aenter__()
        backend = self.settings.default_sandbox_backend
        available = self.sandboxes.availability(backend)
        if not available.available:
            await self.__aexit__(None, None, None)
            raise BackendUnavailableError(
                f"the benchmarks need the {backend} sandbox backend: {available.reason}",
                backend=backend,
            )
        await self.router.start()
        await self.router.register(
            BackendSpec(id="bench", kind="openai", url="http://bench.model/v1", model=MODEL)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.scheduler is not None:
                await self.scheduler.stop()
            await self.router.stop()
            await self.sandboxes.close_all()
        finally:
            self.store.close()
            await asyncio.to_thread(shutil.rmtree, self._root, True)

    @contextlib.asynccontextmanager
    async def pipelined(self) -> AsyncIterator[Scheduler]:
        """The scheduler's three pools, running for the block."""
        self.scheduler = Scheduler(self.settings, self.store, self.runner)
        await self.scheduler.start()
        try:
            yield self.scheduler
        finally:
            await self.scheduler.stop()
            self.scheduler = None

    async def submit(self, requests: list[JobRequest]) -> list[str]:
        """Queue jobs as ``RolloutService.submit`` does; returns their ids."""
        assert self.scheduler is not None
        for request in requests:
            validate(request, self.plugins, self.sandboxes)
        jobs = [
            NewJob(job_id=r.job_id or f"job-{i}", request=r.model_dump(mode="json"))
            for i, r in enumerate(requests)
        ]
        done = await asyncio.to_thread(self.store.submit, jobs, max_queued=self.settings.max_queued)
        self.scheduler.wake()
        return [s.job_id for s in done]

    async def finished(
        self, job_ids: list[str], timeout_s: float, poll_s: float = 0.0
    ) -> list[JobRecord]:
        """The jobs' records once no job in the store is unfinished (raises TimeoutError
        after ``timeout_s``). The store is asked again at each change of a job or, with
        ``poll_s``, every ``poll_s`` seconds (less load where jobs change by the hundred)."""
        assert self.scheduler is not None
        changes = self.scheduler.changes
        end = time.monotonic() + timeout_s
        while True:
            watched = changes.watch()
            counts = await asyncio.to_thread(self.store.counts)
            unfinished = sum(n for status, n in counts.items() if status not in TERMINAL)
            if unfinished == 0:
                break
            if time.monotonic() >= end:
                raise TimeoutError(f"{unfinished} jobs still unfinished after {timeout_s:g}s")
            if poll_s > 0:
                await asyncio.sleep(poll_s)
            else:
                await changes.wait(watched, 0.5)
        records = await asyncio.to_thread(lambda: [self.store.get(j) for j in job_ids])
        return [r for r in records if r is not None]
