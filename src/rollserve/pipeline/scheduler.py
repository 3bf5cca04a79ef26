"""The scheduler: three stages, each with its own worker pool, claiming jobs from the store.

A slow evaluation holds an eval worker, never a run worker. Each worker holds a lease on its
job; one heartbeat renews all of the node's leases, on a thread of its own so that no other
work can make it late; a cancel request (or a lost lease) stops the job's work at once and
frees its sandbox. Infrastructure failures are retried with backoff up to ``max_attempts``
and then end the job as ``failed`` with the error — never as a reward of 0.

Idle workers of a stage take turns: one of them looks for work (and waits for a wake or the
poll) while the others wait behind it, so the store sees one claim per job, not one per idle
worker. Init runs ahead of run by at most the init pool's size: a node holds no more
sandboxes made and waiting for a run worker than it has init workers. A stage that ends where
a worker of the next stage is free passes its job on to it in the same write to the store
(``pass_on``): the job is that worker's without a claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from rollserve.errors import (
    InfrastructureError,
    LayerLostError,
    LeaseLostError,
    RollserveError,
    StoreUnavailableError,
)
from rollserve.pipeline.changes import Changes
from rollserve.pipeline.events import turn_recorder
from rollserve.pipeline.failures import failure
from rollserve.pipeline.figures import Figures
from rollserve.pipeline.fleet import node_alive, node_name, node_report, owner_id
from rollserve.pipeline.passing import PassedJobs
from rollserve.pipeline.room import DataDirRoom
from rollserve.pipeline.stages import StageRunner
from rollserve.pipeline.store_calls import StoreCalls
from rollserve.sandbox import SandboxInstance
from rollserve.schema.jobs import JobRequest
from rollserve.schema.run import RunOutput
from rollserve.settings import Settings
from rollserve.storage.base import JobRecord, JobStatus, JobStore, Stage

log = logging.getLogger(__name__)

_POLL_S = 0.5  # how often idle workers look for work another node may have queued


class Scheduler:
    """Runs the pipeline's worker pools for one node."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        runner: StageRunner,
        paused: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.settings = settings
        self._paused = paused  # this node's part in pauses of models, for its node row
        self.store = store
        self.runner = runner
        self.node = owner_id(settings)  # the lease owner
        self.name = node_name(settings)
        self._held: dict[str, SandboxInstance | None] = {}  # init → run handoff, this node
        self._closing: dict[str, SandboxInstance] = {}  # sandboxes whose close is under way
        self._active: dict[str, asyncio.Task[Any]] = {}
        # The stage each job of this node is at work on until handed back to the store: a claim
        # of such a job for that stage is this node's own lapsed lease, not new work.
        self._working: dict[str, Stage] = {}
        self._wake = {stage: asyncio.Event() for stage in (Stage.INIT, Stage.RUN, Stage.EVAL)}
        self._passed = PassedJobs(list(self._wake))  # handed on to this node's free workers
        self._claiming = {stage: asyncio.Lock() for stage in self._wake}
        self._workers: list[asyncio.Task[None]] = []
        self._calls = StoreCalls(settings.lease_s)
        self._beat_now = asyncio.Event()
        self.store_error: str | None = None  # the last heartbeat's failure: not ready
        self._beat_ok = time.monotonic()  # the last heartbeat the store took
        self.room = DataDirRoom(settings.data_dir)  # no sandbox is made while it is full
        self.busy = {stage: 0 for stage in self._wake}
        self.pools = {
            Stage.INIT: settings.init_workers,
            Stage.RUN: settings.run_workers,
            Stage.EVAL: settings.eval_workers,
        }
        self.changes = Changes()  # a job moved on: wakes long-polls
        self.figures = Figures()  # stage durations and endings, for /metrics

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the fleet (a node row), take back the jobs of dead nodes, then start the
        worker pools."""
        self._calls.open()
        await self._calls.on_lease_thread(
            self.store.heartbeat, [], self.node, self.settings.lease_s, node=self._beat()
        )
        self._beat_ok = time.monotonic()
        await self._recover()
        await self.runner.layers.sweep(lambda job_id: self._calls.retried(self.store.get, job_id))
        for stage, size in self.pools.items():
            self._workers += [
                asyncio.create_task(self._worker(stage), name=f"{stage}-{i}") for i in range(size)
            ]
        self._workers.append(asyncio.create_task(self._heartbeat(), name="heartbeat"))

    async def stop(self) -> None:
        """Stop the workers, close the sandboxes, drop the kept layers no evaluation waits for,
        and leave the fleet: the jobs this node held go back to the queue at once."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        self._passed.clear()  # leased to this node: leave hands them back
        for sandbox in self._held.values():
            if sandbox is not None:
                await self.runner.sandboxes.close(sandbox)
        self._held.clear()
        with contextlib.suppress(StoreUnavailableError):  # a stage stopped before its drop
            await self.runner.layers.sweep(lambda job_id: asyncio.to_thread(self.store.get, job_id))
        try:
            released = await self._calls.on_lease_thread(self.store.leave, self.node)
        except StoreUnavailableError as exc:  # the leases will expire instead
            log.warning("leaving the fleet: %s", exc.message)
        else:
            if released:
                log.info("handed back %d jobs on stopping", len(released))
        await self._calls.close()

    def problem(self) -> str | None:
        """Why this node is not ready (None: it is): the job store does not answer or has
        not taken a heartbeat for a lease, or the data directory is full."""
        if self.store_error is not None:
            return f"the job store does not answer: {self.store_error}"
        silent = time.monotonic() - self._beat_ok
        if self._workers and silent > self.settings.lease_s:
            return f"the job store has taken no heartbeat for {silent:.1f}s"
        return self.room.full()

    def wake(self, stage: Stage = Stage.INIT) -> None:
        """New work for ``stage`` (a submit, a finished earlier stage)."""
        self._wake[stage].set()

    def beat_now(self) -> None:
        """Renew leases (and learn of cancels) now rather than at the next beat."""
        self._beat_now.set()

    async def cancel(self, job_id: str) -> None:
        """Stop the job's work on this node now (the store already marked it cancelled)."""
        task = self._active.get(job_id)
        if task is not None:
            task.cancel()
        if self._passed.take(job_id):  # no worker has it yet: it ends here
            await self._stopped(job_id)
        await self._release(job_id)
        self.changes.notify()

    async def _release(self, job_id: str) -> None:
        """Close the sandbox the job holds on this node, if any: room for init to make another.
        A close already under way (its caller was cancelled mid-close) is waited for, so that
        a cancelled job ends only once its sandbox is gone."""
        sandbox = self._held.pop(job_id, None) or self._closing.get(job_id)
        self.wake(Stage.INIT)
        if sandbox is not None:
            self._closing[job_id] = sandbox
            await self.runner.sandboxes.close(sandbox)
            self._closing.pop(job_id, None)

    # -- workers ---------------------------------------------------------------------------------

    async def _worker(self, stage: Stage) -> None:
        while True:
            async with self._claiming[stage]:
                job = await self._next(stage)
                self.busy[stage] += 1
            try:
                await self._process(stage, job)
            except Exception:  # a bug must not take the worker down with it
                log.exception("worker %s failed on job %s", stage, job.job_id)
            finally:
                self.busy[stage] -= 1

    async def _next(self, stage: Stage) -> JobRecord:
        """The stage's next job: one passed on, or claimed from the store together with a job
        for each other idle worker of the stage (they take theirs as passed on). While there
        is none, wait for a wake (or the poll) — or, for init, while the sandboxes made ahead
        of the run pool fill the allowance."""
        while True:
            self._wake[stage].clear()  # a wake from now on ends the wait below at once
            passed = self._passed.first(stage)
            if passed is not None:
                return passed
            wanted = self._wanted(stage)
            if wanted:
                try:
                    claimed = await asyncio.to_thread(
                        self.store.claim_many, stage, self.node, self.settings.lease_s, wanted
                    )
                except StoreUnavailableError as exc:  # wait for it: nothing is lost
                    log.warning("%s workers cannot claim: %s", stage, exc.message)
                    claimed = []
                for job in claimed:
                    if self._working.get(job.job_id) == stage:
                        log.warning("job %s: its lease lapsed while at work here; kept", job.job_id)
                        continue  # the worker at it goes on: the claim renewed its lease
                    if self._passed.take(job.job_id):
                        log.warning("job %s: its lease lapsed while passed on here", job.job_id)
                    self._passed.add(stage, job)
                passed = self._passed.first(stage)
                if passed is not None:
                    return passed
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can leave a worker hung
            # when its cancellation (a stop) lands together with the timeout.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_POLL_S):
                    await self._wake[stage].wait()

    def _wanted(self, stage: Stage) -> int:
        """How many jobs the claiming worker of ``stage`` claims: one for itself and each
        other worker of the stage that is idle and not spoken for; init, no more than its
        allowance leaves room for. 0: it may not claim now."""
        if not self._may_claim(stage):
            return 0
        idle = self.pools[stage] - self.busy[stage] - self._passed.spoken_for(stage)
        if stage == Stage.INIT:
            idle = min(idle, self._init_room())
        return max(1, idle)

    def _may_claim(self, stage: Stage) -> bool:
        """Not while the heartbeat is late (a claim could take a lapsed lease of this node's
        own work); init and eval make sandboxes: not while the data directory is full, and
        init not past its allowance."""
        if time.monotonic() - self._beat_ok > self.settings.lease_s / 2:
            return False  # the heartbeat is late: it renews this node's leases first
        if stage == Stage.RUN:
            return True
        if self.room.full() is not None:
            return False
        return stage != Stage.INIT or self._init_room() > 0

    def _may_pass(self, stage: Stage) -> bool:
        """A worker of ``stage`` is free here to take a job on at once, and may claim."""
        free = self.busy[stage] + self._passed.spoken_for(stage) < self.pools[stage]
        return free and self._may_claim(stage)

    def _init_room(self) -> int:
        """How many more sandboxes init may make: those held (running or made and waiting)
        and being made stay within the run pool plus the init pool."""
        allowance = self.settings.run_workers + self.settings.init_workers
        return allowance - len(self._held) - self.busy[Stage.INIT]

    async def _process(self, stage: Stage, job: JobRecord) -> None:
        work = asyncio.current_task()
        assert work is not None
        inner = asyncio.ensure_future(self._stage(stage, job))
        self._active[job.job_id] = inner
        self._working[job.job_id] = stage
        try:
            await inner
        except asyncio.CancelledError:
            if work.cancelling():  # the worker itself is being stopped
                raise
            await self._stopped(job.job_id)
        except LeaseLostError:
            log.warning("job %s: lease lost, another worker has it", job.job_id)
        finally:
            if self._active.get(job.job_id) is inner:
                del self._active[job.job_id]
                if self._working.get(job.job_id) == stage:
                    del self._working[job.job_id]
            self.changes.notify()

    async def _heartbeat(self) -> None:
        """Every third of a lease (or at once when asked): one write renews the leases of
        every job this node works on and keeps its node row alive; the work of jobs
        cancelled by a client (through any node) or taken over stops. Once a lease, the jobs
        of nodes that are gone are taken back."""
        loop = asyncio.get_running_loop()
        lease_s = self.settings.lease_s
        recovered = loop.time()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(lease_s / 3):
                    await self._beat_now.wait()
            self._beat_now.clear()
            work = dict(self._active)
            leased = [*work, *(i for i in self._passed.ids() if i not in work)]
            try:
                stop = await self._calls.on_lease_thread(
                    self.store.heartbeat, leased, self.node, lease_s, node=self._beat()
                )
                if loop.time() - recovered >= lease_s:
                    recovered = loop.time()
                    await self._recover()
            except StoreUnavailableError as exc:  # the next beat tries again
                if self.store_error is None:
                    log.error("the job store does not answer; not ready until it does: %s", exc)
                self.store_error = exc.message
                continue
            except Exception:  # a bug: logged, and the next beat tries again
                log.exception("renewing %d leases failed", len(work))
                continue
            self._beat_ok = time.monotonic()
            if self.store_error is not None:
                log.warning("the job store answers again")
                self.store_error = None
            for job_id in stop:
                if job_id in work:
                    work[job_id].cancel()
                elif self._passed.take(job_id):  # cancelled or taken over before its turn
                    await self._stopped(job_id)
            await self._drop_ended()

    async def _drop_ended(self) -> None:
        """Close the sandboxes made for jobs that ended while they waited for the run pool:
        cancelled through another node, they hold no lease, and no heartbeat tells of them."""
        for job_id in [j for j in self._held if j not in self._active]:
            record = await self._calls.retried(self.store.get, job_id)
            if (record is None or record.stage == Stage.DONE) and job_id not in self._active:
                await self._release(job_id)
                self.changes.notify()

    async def _recover(self) -> None:
        released = await self._calls.on_lease_thread(self.store.recover, node_alive)
        if released:
            log.warning("took back %d jobs of nodes that are gone: %s", len(released), released)
            self.wake(Stage.INIT)
            self.wake(Stage.EVAL)

    def _beat(self) -> tuple[str, dict[str, Any]]:
        """What the node row says of this node: its name and figures."""
        workers = {stage: (self.busy[stage], size) for stage, size in self.pools.items()}
        held, live = len(self._held), len(self.runner.sandboxes.live)
        return self.name, node_report(workers, held, live, self._paused())

    async def _stopped(self, job_id: str) -> None:
        """The job's work was cancelled: end it as cancelled if a client asked for it."""
        await self._release(job_id)
        record = await self._calls.retried(self.store.get, job_id)
        if record is not None and record.cancel_requested and record.lease_owner == self.node:
            self._working.pop(job_id, None)
            await self._calls.retried(self.store.finish, job_id, self.node, JobStatus.CANCELLED)
            await self.runner.layers.drop(job_id)
            self.figures.job_ended(JobStatus.CANCELLED.value)

    async def _stage(self, stage: Stage, job: JobRecord) -> None:
        started = time.monotonic()
        try:
            request = job.job_request()
            if stage == Stage.INIT:
                await self._init(job, request, started)
            elif stage == Stage.RUN:
                await self._run(job, request, started)
            else:
                await self._eval(job, request, started)
        except Exception as exc:
            error, status = failure(stage, job.job_id, exc)
            if status is None:
                await self._infrastructure_failure(stage, job, error)
            else:
                await self._fail(job, error, status)

    async def _init(self, job: JobRecord, request: JobRequest, started: float) -> None:
        await self.runner.admitted(request)  # a pause may hold new jobs of its model
        started = time.monotonic()
        async with asyncio.timeout(self.runner.timeout(request, "init_s")):
            sandbox = await self.runner.init(request)
        self._held[job.job_id] = sandbox
        queued = max(0.0, time.time() - job.created - (time.monotonic() - started))
        timing = {
            "queued_s": queued if job.attempts == 1 else job.timing.get("queued_s", queued),
            "init_s": time.monotonic() - started,
        }
        # Still this worker's until the store has it in the next stage: a claim that takes
        # the lease lapsed meanwhile (a slow store) is of work in hand, not new work.
        advanced = await self._hand_on(job, Stage.RUN, timing=timing)
        self.figures.stage_done(Stage.INIT.value, timing["init_s"])
        if not advanced:  # cancelled while its sandbox was being made
            await self._release(job.job_id)

    async def _run(self, job: JobRecord, request: JobRequest, started: float) -> None:
        if job.job_id not in self._held:  # its sandbox is gone (a lost lease): init again
            lost = InfrastructureError("the job's sandbox was lost", stage=Stage.RUN.value)
            await self._infrastructure_failure(Stage.RUN, job, lost)
            return
        sandbox = self._held[job.job_id]
        try:
            output = await self.runner.run(
                job.job_id,
                request,
                sandbox,
                self.runner.timeout(request, "run_s"),
                on_turn=turn_recorder(self.store, job),
            )
        finally:
            await self._release(job.job_id)  # before evaluation starts
        timing = {"run_s": time.monotonic() - started}
        self.figures.stage_done(Stage.RUN.value, timing["run_s"])
        if output.exit_reason == "timeout" and not self.settings.evaluate_timed_out_runs:
            await self._complete(job, request, output, timing, evaluate=False)
            return
        stay = output.layer is not None  # the layer is on this node
        await self._hand_on(job, Stage.EVAL, output=output.to_json(), timing=timing, stay=stay)

    async def _hand_on(self, job: JobRecord, stage: Stage, **kwargs: Any) -> bool:
        """Hand the job on to ``stage`` (``kwargs``: the store's output, timing and stay):
        passed on to a worker of this node's that is free, else to the store's queue for that
        stage. False: it was cancelled instead."""
        if not self._may_pass(stage):
            advanced = await self._calls.retried(
                self.store.advance, job.job_id, self.node, stage, **kwargs
            )
            self.wake(stage)
            return advanced
        with self._passed.passing(stage):
            passed = await self._calls.retried(
                self.store.pass_on, job, self.node, stage, self.settings.lease_s, **kwargs
            )
        if passed is None:
            return False
        self._passed.add(stage, passed)
        self.wake(stage)
        return True

    async def _eval(self, job: JobRecord, request: JobRequest, started: float) -> None:
        output = job.run_output()
        if output is None:  # a store that lost what run handed on: run the episode again
            raise LayerLostError(f"job {job.job_id} reached evaluation without its run's output")
        await self._complete(job, request, output, {}, evaluate=True, started=started)

    async def _complete(
        self,
        job: JobRecord,
        request: JobRequest,
        output: RunOutput,
        timing: dict[str, float],
        *,
        evaluate: bool,
        started: float | None = None,
    ) -> None:
        limit = self.runner.timeout(request, "eval_s")
        if evaluate:
            begun = started or time.monotonic()
            try:
                async with asyncio.timeout(limit):
                    result = await self.runner.evaluate(request, output)
            except TimeoutError:
                # The submission made the evaluation hang: it scores 0, with the reason.
                result = self.runner.unscored(output, f"evaluation exceeded {limit}s")
            timing = {**timing, "eval_s": time.monotonic() - begun}
            self.figures.stage_done(Stage.EVAL.value, timing["eval_s"])
        else:
            result = self.runner.unscored(output, "the run timed out and was not evaluated")
        await self._calls.retried(
            self.store.finish,
            job.job_id,
            self.node,
            JobStatus.COMPLETED,
            result=result.model_dump(mode="json"),
            timing=timing,
        )
        await self.runner.layers.drop(job.job_id)
        self.figures.job_ended(JobStatus.COMPLETED.value, str(output.exit_reason))

    async def _infrastructure_failure(
        self, stage: Stage, job: JobRecord, exc: RollserveError
    ) -> None:
        """Retry the job after a backoff — an evaluation in eval (the run's output is kept),
        anything else from init — or end it as failed after ``max_attempts``. The backoff is
        spent parked in the store, holding no worker and no lease."""
        await self._release(job.job_id)
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        if job.attempts >= self.settings.max_attempts:
            await self._fail(job, exc)
            return
        log.warning("job %s attempt %d: %s; retrying", job.job_id, job.attempts, exc.message)
        lost = isinstance(exc, LayerLostError)  # an evaluation whose run's layer is gone
        retry = Stage.EVAL if stage == Stage.EVAL and not lost else Stage.INIT
        delay = self.settings.retry_backoff_s * 2 ** (job.attempts - 1)
        self._working.pop(job.job_id, None)  # back in a stage it may have been in: new work
        await self._calls.retried(
            self.store.requeue, job.job_id, self.node, retry, error=error, delay_s=delay
        )
        self.wake(retry)

    async def _fail(
        self, job: JobRecord, exc: RollserveError, status: JobStatus = JobStatus.FAILED
    ) -> None:
        await self._release(job.job_id)
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        await self._calls.retried(self.store.finish, job.job_id, self.node, status, error=error)
        await self.runner.layers.drop(job.job_id)
        self.figures.job_ended(status.value)
