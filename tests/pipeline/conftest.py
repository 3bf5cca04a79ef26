"""A real pipeline for tests: SQLite store, bwrap sandboxes, the echo task and script agent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from rollserve.node import default_plugins
from rollserve.pipeline.scheduler import Scheduler
from rollserve.pipeline.stages import StageRunner, validate
from rollserve.plugins import Plugins
from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import JobRequest
from rollserve.settings import Settings
from rollserve.storage import JobRecord, NewJob, SqliteJobStore
from rollserve.testing.pipeline import EchoHandler, ScriptAgent
from tests.conformance.conftest import require


@dataclass
class Pipeline:
    store: SqliteJobStore
    scheduler: Scheduler
    sandboxes: SandboxManager
    plugins: Plugins
    echo: EchoHandler

    def submit(self, *requests: JobRequest) -> list[str]:
        for request in requests:
            validate(request, self.plugins, self.sandboxes)
        jobs = [
            NewJob(
                r.job_id or f"job-{i}-{time.monotonic_ns()}",
                r.model_dump(mode="json"),
                r.group_id,
                r.priority,
            )
            for i, r in enumerate(requests)
        ]
        done = self.store.submit(jobs, max_queued=self.scheduler.settings.max_queued)
        self.scheduler.wake()
        return [s.job_id for s in done]

    async def wait(self, job_ids: list[str], timeout: float = 60) -> list[JobRecord]:
        end = time.monotonic() + timeout
        while True:
            records = [self.store.get(j) for j in job_ids]
            if all(r is not None and r.status.terminal for r in records):
                return [r for r in records if r is not None]
            if time.monotonic() > end:
                raise AssertionError(f"jobs not finished: {records}")
            await asyncio.sleep(0.05)

    async def until(
        self, job_id: str, predicate: Callable[[JobRecord], bool], timeout: float = 30
    ) -> JobRecord:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            record = self.store.get(job_id)
            if record is not None and predicate(record):
                return record
            await asyncio.sleep(0.02)
        raise AssertionError(f"job {job_id} never got there: {self.store.get(job_id)}")


async def until_true(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Wait until ``predicate()`` holds; AssertionError naming ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"never happened within {timeout:g}s: {what}")
        await asyncio.sleep(0.02)


def echo_request(
    prompt: str = "hello", *, commands: list[str] | None = None, **task: Any
) -> JobRequest:
    return JobRequest.model_validate(
        {
            "task": {"task_id": prompt, "kind": "echo", "prompt": prompt, **task},
            "agent": {
                "name": "script",
                "commands": commands
                if commands is not None
                else [f"printf %s {prompt} > answer.txt"],
            },
        }
    )


@pytest.fixture
def pipeline_factory(tmp_path: Any) -> Callable[..., Any]:
    @asynccontextmanager
    async def make(**overrides: Any) -> AsyncIterator[Pipeline]:
        fields = {
            "data_dir": tmp_path / "data",
            "lease_s": 3.0,
            "retry_backoff_s": 0.0,
            "init_workers": 2,
            "run_workers": 4,
            "eval_workers": 2,
            **overrides,
        }
        settings = Settings(**fields)
        store = SqliteJobStore(settings.job_db)
        async with SandboxManager(settings) as sandboxes:
            require(sandboxes, settings.default_sandbox_backend)
            plugins = default_plugins()
            echo = EchoHandler()
            plugins.handlers.register(echo.name, echo)
            plugins.agents.register(ScriptAgent.name, ScriptAgent())
            scheduler = Scheduler(settings, store, StageRunner(settings, sandboxes, plugins))
            await scheduler.start()
            try:
                yield Pipeline(store, scheduler, sandboxes, plugins, echo)
            finally:
                await scheduler.stop()
                store.close()

    return make
