"""The rollout service of one node: the store, the sandboxes and the scheduler together, with
what the HTTP API offers (submit, look up, wait, cancel, the results feed, status)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

from rollserve.errors import InvalidInputError, JobNotFoundError
from rollserve.gateway.keys import Gateway
from rollserve.llm.router import Router
from rollserve.llm.templates import ChatTemplate, TemplateCache
from rollserve.pipeline.scheduler import Scheduler
from rollserve.pipeline.stages import validate
from rollserve.pipeline.trajectories import add_token_text, build_trajectory
from rollserve.plugins import Plugins
from rollserve.sandbox import SandboxManager
from rollserve.schema.api import JobQuery, JobsPage, Trajectory
from rollserve.schema.backends import ModelState, PauseRequest
from rollserve.schema.jobs import JobRequest, JobTiming, JobView
from rollserve.schema.status import FleetNode, NodeStatus, StageLoad
from rollserve.settings import Settings
from rollserve.storage import JobRecord, NewJob, Stage, Submitted
from rollserve.storage.base import Store, StoreEvent

# Long-polls wake at once on changes the store announces (every node's, on PostgreSQL); a
# store that announces nothing (SQLite shared by processes) is looked at this often.
_WAIT_POLL_S = 1.0
# A pause waits on the nodes' rows, which each node writes as soon as its part changes.
_PAUSE_POLL_S = 0.1


class RolloutService:
    """Owns everything a ``rollserve serve`` process runs; ``start``/``stop`` bracket it."""

    def __init__(
        self,
        settings: Settings,
        plugins: Plugins,
        *,
        store: Store,
        sandboxes: SandboxManager,
        templates: TemplateCache,
        router: Router,
        gateway: Gateway,
        scheduler: Scheduler,
    ) -> None:
        """Made by :func:`rollserve.node.build_node`, which assembles the parts."""
        self.settings = settings
        self.plugins = plugins
        self.store = store
        self.sandboxes = sandboxes
        self.templates = templates
        self.router = router
        self.gateway = gateway
        self.scheduler = scheduler
        self.started = time.time()
        self._purger: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    async def start(self) -> None:
        # The node's own directory (its sandboxes' state; the SQLite store, if that is the
        # store): its free space is watched from the start, whichever store holds the jobs.
        await asyncio.to_thread(self.settings.data_dir.mkdir, parents=True, exist_ok=True)
        await self.sandboxes.__aenter__()  # reaps what a crashed predecessor left
        await self.router.start()
        await self.scheduler.start()
        self._purger = asyncio.create_task(self._purge_loop())
        loop = asyncio.get_running_loop()

        def announced(event: StoreEvent) -> None:  # on the store's thread
            loop.call_soon_threadsafe(self._on_store_event, event)

        self._unsubscribe = self.store.subscribe(announced)

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            await asyncio.to_thread(self._unsubscribe)
            self._unsubscribe = None
        if self._purger is not None:
            self._purger.cancel()
        await self.scheduler.stop()
        await self.router.stop()
        await self.sandboxes.close_all()
        self.store.close()

    def _on_store_event(self, event: StoreEvent) -> None:
        """A change announced by the store, made by this node or another."""
        everything = event == StoreEvent.ANY
        if everything or event == StoreEvent.INIT:
            self.scheduler.wake(Stage.INIT)
        if everything or event == StoreEvent.EVAL:
            self.scheduler.wake(Stage.EVAL)
        if everything or event == StoreEvent.DONE:
            self.scheduler.changes.notify()
        if everything or event == StoreEvent.CANCEL:
            self.scheduler.beat_now()
        if everything or event == StoreEvent.BACKENDS:
            self.router.sync_soon()

    async def _purge_loop(self) -> None:
        while True:
            cutoff = time.time() - self.settings.result_retention_s
            await asyncio.to_thread(self.store.purge, cutoff)
            await asyncio.sleep(min(3600.0, self.settings.result_retention_s / 10))

    # -- jobs ------------------------------------------------------------------------------------

    async def submit(self, requests: list[JobRequest]) -> list[Submitted]:
        """Validate every request (nothing is queued if one is bad), then store them all."""
        if len(requests) > self.settings.max_batch_jobs:
            raise InvalidInputError(
                f"a batch of {len(requests)} jobs; this server takes at most "
                f"{self.settings.max_batch_jobs} in one (max_batch_jobs)",
                field="jobs",
            )
        for request in requests:
            validate(request, self.plugins, self.sandboxes)
        jobs = [
            NewJob(
                job_id=r.job_id or secrets.token_hex(8),
                request=r.model_dump(mode="json", exclude={"job_id"}),
                group_id=r.group_id,
                priority=r.priority,
            )
            for r in requests
        ]
        submitted = await asyncio.to_thread(
            self.store.submit, jobs, max_queued=self.settings.max_queued
        )
        self.scheduler.wake()
        return submitted

    async def record(self, job_id: str) -> JobRecord:
        record = await asyncio.to_thread(self.store.get, job_id)
        if record is None:
            raise JobNotFoundError(f"no job {job_id!r}", job_id=job_id)
        return record

    async def wait(self, job_id: str, wait_s: float) -> JobRecord:
        """The job, once terminal or after ``wait_s`` seconds, whichever comes first."""
        end = time.monotonic() + wait_s
        while True:
            changed = self.scheduler.changes.watch()
            record = await self.record(job_id)
            if record.status.terminal or time.monotonic() >= end:
                return record
            await self.scheduler.changes.wait(changed, min(_WAIT_POLL_S, end - time.monotonic()))

    async def cancel(self, job_id: str) -> JobRecord:
        await asyncio.to_thread(self.store.cancel, job_id)
        await self.scheduler.cancel(job_id)
        return await self.record(job_id)

    async def cancel_group(self, group_id: str) -> list[str]:
        touched = await asyncio.to_thread(self.store.cancel_group, group_id)
        for job_id in touched:
            await self.scheduler.cancel(job_id)
        return touched

    async def results(self, after: int, limit: int, wait_s: float) -> list[JobRecord]:
        """Finished jobs after the cursor; waits up to ``wait_s`` for the first one."""
        end = time.monotonic() + wait_s
        while True:
            changed = self.scheduler.changes.watch()
            found = await asyncio.to_thread(self.store.results, after, limit)
            if found or time.monotonic() >= end:
                return found
            await self.scheduler.changes.wait(changed, min(_WAIT_POLL_S, end - time.monotonic()))

    # -- browsing (the web viewer) ----------------------------------------------------------------

    async def list_jobs(self, query: JobQuery) -> JobsPage:
        return await asyncio.to_thread(self.store.list_jobs, query)

    async def trajectory(self, job_id: str) -> Trajectory:
        """The job's trajectory; a running job's from its events so far. Token mode: each
        token's text, when a registered backend of the job names its tokenizer."""
        record = await self.record(job_id)
        events = [] if record.result else await asyncio.to_thread(self.store.events, job_id)
        found = build_trajectory(view(record), events=events)
        if found.tokens is not None:
            template = await self._template_of(found)
            if template is not None:
                await asyncio.to_thread(add_token_text, found, template.pieces)
        return found

    async def _template_of(self, trajectory: Trajectory) -> ChatTemplate | None:
        """The chat template of a backend that served the trajectory (or its model)."""
        tokens = trajectory.tokens
        used = {turn.backend_id for turn in tokens.turns} if tokens else set()
        for backend in self.router.views():
            if backend.tokenizer and (backend.id in used or backend.model == trajectory.model):
                return await self.templates.aget(backend.tokenizer)
        return None

    # -- pauses of a model across the fleet -------------------------------------------------------

    async def pause_model(self, model: str, request: PauseRequest) -> ModelState:
        """Pause ``model`` on every node of the store; returns once every live node has taken
        the pause up and none runs a call of the model any more, or after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s
        await self.router.pause(model, request)
        while True:
            state = await self.model_state(model)
            remaining = deadline - loop.time()
            if not state.paused or (not state.in_flight and not state.nodes_pending):
                return state
            if remaining <= 0:
                return state
            await asyncio.sleep(min(_PAUSE_POLL_S, remaining))

    async def model_state(self, model: str) -> ModelState:
        """The pause of ``model`` here, with the calls in flight on every node as their node
        rows last said, and the nodes that have yet to take the pause up or drain."""
        state = self.router.model_state(model)
        token = self.router.pauses.token(model)
        if token is None:
            return state
        nodes = await asyncio.to_thread(self.store.nodes)
        in_flight, pending = state.in_flight, []
        for node in nodes:
            if not node.alive or node.owner == self.scheduler.node:
                continue
            report = node.info.get("paused", {}).get(model)
            if report is None or report.get("token") != token:
                pending.append(node.node_id)
                continue
            in_flight += int(report.get("in_flight", 0))
            if report.get("in_flight"):
                pending.append(node.node_id)
        return state.model_copy(update={"in_flight": in_flight, "nodes_pending": pending})

    async def status(self) -> NodeStatus:
        """The node's figures; the store is read off the event loop."""
        pools = self.scheduler.pools
        depth, counts, head, nodes = await asyncio.to_thread(
            lambda: (
                self.store.waiting(),
                self.store.counts(),
                self.store.results_head(),
                self.store.nodes(),
            )
        )
        return NodeStatus(
            node=self.scheduler.node,
            node_id=self.scheduler.name,
            nodes=[
                FleetNode(
                    node_id=n.node_id,
                    owner=n.owner,
                    alive=n.alive,
                    started=n.started,
                    seen=n.seen,
                    **n.info,
                )
                for n in nodes
            ],
            uptime_s=round(time.time() - self.started, 3),
            not_ready=self.scheduler.problem(),
            stages={
                stage.value: StageLoad(
                    queued=depth.get(stage.value, 0),
                    active=self.scheduler.busy[stage],
                    workers=size,
                )
                for stage, size in pools.items()
            },
            jobs=counts,
            results_cursor=head,
            live_sandboxes=len(self.sandboxes.live),
            figures=self.scheduler.figures.view(),
            backends=self.router.views(),
            paused_models=[self.router.model_state(m) for m in self.router.pauses.models()],
        )


def view(record: JobRecord) -> JobView:
    """A stored job as a client sees it."""
    task = record.request.get("task") or {}
    return JobView(
        job_id=record.job_id,
        group_id=record.group_id,
        task_id=task.get("task_id"),
        kind=task.get("kind"),
        model=record.request.get("model"),
        status=record.status.value,
        attempts=record.attempts,
        created=record.created,
        finished=record.finished,
        timing=JobTiming(**record.timing),
        result=record.rollout_result(),
        error=record.error_info() if record.status.terminal and record.result is None else None,
    )
