"""``rollserve bench pipeline``: the three-stage pipeline against rollouts that hold their model
slot from sandbox start to reward, with the same number of model slots.

Every mode runs the same rollouts: an ``echo`` task in a real bwrap sandbox whose setup takes a
seeded lognormal time after the sandbox starts, the tool agent against the scripted model
behind the real Router (``turns`` calls of ``model_ms`` each; every call but the last runs a
real command in the sandbox's persistent shell, the last submits), and an evaluation in a
fresh sandbox that takes a seeded lognormal (heavy-tailed) time. ``slots`` is what the
inference servers can run at once, the scarce resource:

- ``pipeline``: the Scheduler with ``slots`` run workers; init and eval have their own pools.
- ``coupled``: ``slots`` workers, each taking a rollout through init → run → eval (the same
  StageRunner calls) before the next, holding its slot all along, as rollouts embedded in a
  trainer do.
- ``sync``: as coupled, but batch-synchronous: a batch of ``slots`` rollouts must all end
  before the next batch starts.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass

from rich.table import Table

from rollserve.bench.model import ModelScript
from rollserve.bench.rig import Rig, Sampler, echo_job
from rollserve.bench.stats import quantile
from rollserve.errors import RollserveError
from rollserve.pipeline.stages import StageRunner
from rollserve.schema.bench import ModeFigures, PipelineBenchResult, PipelineMode
from rollserve.schema.jobs import JobRequest, RolloutResult
from rollserve.storage import JobRecord, JobStatus

# What the scripted model runs, turn after turn: real commands in the sandbox's shell.
COMMANDS = (
    "cat task.txt",
    "printf %s {prompt} > answer.txt",
    "ls -la",
    "grep -c . task.txt && wc -c answer.txt",
    "seq 1 2000 | sort -rn | head -n 3",
)


@dataclass(frozen=True)
class PipelineWorkload:
    """The rollouts every mode runs, and the pools of the pipeline."""

    rollouts: int = 128
    slots: int = 8
    turns: int = 6  # model calls per rollout; the last one submits
    model_ms: float = 150.0  # per call, uniformly within ±jitter of it
    jitter: float = 0.5
    init_ms: float = 150.0  # median setup time after the sandbox started (lognormal)
    init_sigma: float = 0.5
    eval_ms: float = 400.0  # median evaluation time (lognormal)
    eval_sigma: float = 1.0
    init_workers: int | None = None  # default: slots / 2
    eval_workers: int | None = None  # default: 2 x slots
    seed: int = 0

    @property
    def pools(self) -> dict[str, int]:
        """The pipeline's pool sizes."""
        return {
            "init": self.init_workers or max(1, self.slots // 2),
            "run": self.slots,
            "eval": self.eval_workers or 2 * self.slots,
        }

    def script(self) -> ModelScript:
        commands = tuple(COMMANDS[i % len(COMMANDS)] for i in range(self.turns - 1))
        return ModelScript(
            commands=commands,
            latency_s=self.model_ms / 1000,
            jitter=self.jitter,
            slots=self.slots,
            seed=self.seed,
        )

    def jobs(self) -> list[JobRequest]:
        """The rollouts, with their seeded setup and evaluation times."""
        rng = random.Random(self.seed)

        def draw(median_ms: float, sigma: float) -> float:
            if median_ms <= 0:
                return 0.0
            return round(rng.lognormvariate(math.log(median_ms / 1000), sigma), 4)

        return [
            echo_job(
                i,
                turns=self.turns,
                init_delay_s=draw(self.init_ms, self.init_sigma),
                eval_delay_s=draw(self.eval_ms, self.eval_sigma),
            )
            for i in range(self.rollouts)
        ]

    def describe(self) -> str:
        """The workload in a sentence."""
        pools = self.pools
        return (
            f"{self.rollouts} rollouts, {self.slots} model slots; {self.turns} model calls of "
            f"{self.model_ms:g} ms ±{self.jitter:.0%} per rollout ({self.turns - 1} bash "
            f"commands, then submit); init: bwrap start + lognormal setup (median "
            f"{self.init_ms:g} ms, sigma {self.init_sigma:g}); eval: fresh bwrap sandbox + "
            f"lognormal time (median {self.eval_ms:g} ms, sigma {self.eval_sigma:g}); "
            f"pipeline pools init/run/eval {pools['init']}/{pools['run']}/{pools['eval']}; "
            f"seed {self.seed}"
        )


def _figures(
    mode: PipelineMode,
    workload: PipelineWorkload,
    rig: Rig,
    *,
    seconds: float,
    latencies: list[float],
    completed: int,
    peak: int,
    workers: dict[str, int],
) -> ModeFigures:
    slot_seconds = workload.slots * seconds
    idle = max(0.0, 1 - rig.model.busy_s / slot_seconds) if slot_seconds > 0 else 0.0
    return ModeFigures(
        mode=mode,
        rollouts=workload.rollouts,
        completed=completed,
        failed=workload.rollouts - completed,
        seconds=round(seconds, 3),
        rollouts_per_s=round(completed / seconds, 3) if seconds > 0 else 0.0,
        p50_s=round(quantile(latencies, 0.5), 3),
        p99_s=round(quantile(latencies, 0.99), 3),
        slot_idle_fraction=round(idle, 3),
        model_calls=rig.model.calls,
        peak_sandboxes=peak,
        workers=workers,
    )


def _succeeded(record: JobRecord) -> bool:
    if record.status != JobStatus.COMPLETED or record.result is None:
        return False
    result = record.rollout_result()
    return result is not None and result.reward == 1.0


async def _pipeline(workload: PipelineWorkload) -> ModeFigures:
    pools = workload.pools
    async with Rig(
        workload.script(),
        init_workers=pools["init"],
        run_workers=pools["run"],
        eval_workers=pools["eval"],
    ) as rig:
        jobs = workload.jobs()
        async with rig.pipelined():
            sampler = Sampler(lambda: len(rig.sandboxes.live))
            sampler.start()
            start = time.perf_counter()
            ids = await rig.submit(jobs)
            records = await rig.finished(ids, timeout_s=3600)
            seconds = time.perf_counter() - start
            peak = await sampler.stop()
        latencies = [
            r.finished - r.created - r.timing.get("queued_s", 0.0)
            for r in records
            if r.finished is not None
        ]
        return _figures(
            "pipeline",
            workload,
            rig,
            seconds=seconds,
            latencies=latencies,
            completed=sum(_succeeded(r) for r in records),
            peak=peak,
            workers=pools,
        )


async def one_rollout(runner: StageRunner, request: JobRequest) -> RolloutResult:
    """init → run → eval of one job by one caller, as a trainer's embedded rollout does (the
    run sandbox is closed before evaluation, as the scheduler does)."""
    assert request.job_id is not None
    sandbox = await runner.init(request)
    try:
        output = await runner.run(request.job_id, request, sandbox, runner.settings.run_timeout_s)
    finally:
        if sandbox is not None:
            await runner.sandboxes.close(sandbox)
    return await runner.evaluate(request, output)


async def _coupled(workload: PipelineWorkload, *, synchronous: bool) -> ModeFigures:
    async with Rig(workload.script()) as rig:
        jobs = workload.jobs()
        latencies: list[float] = []
        completed = 0

        async def one(request: JobRequest) -> None:
            nonlocal completed
            begun = time.perf_counter()
            try:
                result = await one_rollout(rig.runner, request)
            except RollserveError:
                return
            latencies.append(time.perf_counter() - begun)
            completed += result.reward == 1.0

        async def worker(queue: asyncio.Queue[JobRequest]) -> None:
            while not queue.empty():
                await one(queue.get_nowait())

        sampler = Sampler(lambda: len(rig.sandboxes.live))
        sampler.start()
        start = time.perf_counter()
        if synchronous:
            for first in range(0, len(jobs), workload.slots):
                await asyncio.gather(*(one(j) for j in jobs[first : first + workload.slots]))
        else:
            queue: asyncio.Queue[JobRequest] = asyncio.Queue()
            for job in jobs:
                queue.put_nowait(job)
            await asyncio.gather(*(worker(queue) for _ in range(workload.slots)))
        seconds = time.perf_counter() - start
        peak = await sampler.stop()
        return _figures(
            "sync" if synchronous else "coupled",
            workload,
            rig,
            seconds=seconds,
            latencies=latencies,
            completed=completed,
            peak=peak,
            workers={"workers": workload.slots},
        )


async def bench_pipeline(workload: PipelineWorkload) -> PipelineBenchResult:
    """All three modes, one after another, on the same rollouts."""
    modes: dict[PipelineMode, ModeFigures] = {
        "pipeline": await _pipeline(workload),
        "coupled": await _coupled(workload, synchronous=False),
        "sync": await _coupled(workload, synchronous=True),
    }

    def ratio(other: ModeFigures) -> float:
        base = other.rollouts_per_s
        return round(modes["pipeline"].rollouts_per_s / base, 2) if base > 0 else 0.0

    return PipelineBenchResult(
        modes=modes,
        speedup_vs_coupled=ratio(modes["coupled"]),
        speedup_vs_sync=ratio(modes["sync"]),
    )


def pipeline_table(result: PipelineBenchResult, workload: PipelineWorkload) -> Table:
    """The figures as a table, the workload in its caption."""
    table = Table(
        "mode",
        "rollouts/s",
        "p50 s",
        "p99 s",
        "slots idle",
        "peak sandboxes",
        "seconds",
        "ok / failed",
        caption=(
            f"{workload.describe()}. Pipeline speed-up: "
            f"{result.speedup_vs_coupled:.2f}x over coupled, "
            f"{result.speedup_vs_sync:.2f}x over sync."
        ),
    )
    for mode in result.modes.values():
        table.add_row(
            mode.mode,
            f"{mode.rollouts_per_s:.2f}",
            f"{mode.p50_s:.2f}",
            f"{mode.p99_s:.2f}",
            f"{mode.slot_idle_fraction:.0%}",
            str(mode.peak_sandboxes),
            f"{mode.seconds:.1f}",
            f"{mode.completed} / {mode.failed}",
        )
    return table
