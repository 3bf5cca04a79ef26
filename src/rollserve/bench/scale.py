"""``rollserve bench scale``: how many light rollouts one node holds open at once.

Each step submits N rollouts to the Scheduler (run pool of N): an ``echo`` task in a bwrap
sandbox, the tool agent with a persistent shell, ``turns`` calls to the scripted model (every
one but the last runs a trivial command), and an evaluation in a fresh sandbox. The model
holds each rollout's first call until all N rollouts have made theirs (or a timeout passed),
so that the N sandboxes are live at once and then start their N shells together; the step
reports how many made it to that point (``concurrent``), errors, latency, throughput, the
time of a turn besides the model's own, and the memory of rollserve's process tree while the
model holds every rollout's third call, after two commands in its shell (all N sandboxes and
shells live). At that hold, with the event loop otherwise idle, it also closes a few probe
sandboxes, each with its shell and a background process live: a close's own cost with N others
live, which must not grow with N (a close that scanned every host process would). The
rollouts' own closes, timed amid the step's load, are reported beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rich.table import Table

from rollserve.bench.memory import TreeMemory, raise_nofile, tree_memory
from rollserve.bench.model import ModelScript, ScriptedToolBackend
from rollserve.bench.rig import Rig, Sampler, echo_job
from rollserve.bench.stats import quantile, running_user
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.bench import ScaleBenchResult, ScaleStep
from rollserve.shell import ShellSession
from rollserve.storage import JobStatus

LADDER = (50, 100, 200, 500, 800, 1000, 1500, 2000, 3000)
COMMANDS = ("printf %s {prompt} > answer.txt", "cat answer.txt", "ls -la")
_MIB = 1024
PROBE_CLOSES = 10


@dataclass(frozen=True)
class ScaleWorkload:
    """The steps and what each rollout does."""

    max_rollouts: int = 800
    turns: int = 4  # model calls per rollout; the last one submits
    model_ms: float = 500.0
    jitter: float = 0.2
    init_workers: int = 32
    eval_workers: int = 32
    barrier_timeout_s: float = 600.0

    def steps(self) -> list[int]:
        """The ladder's steps below the maximum, then the maximum."""
        return [n for n in LADDER if n < self.max_rollouts] + [self.max_rollouts]


async def _probe_closes(manager: SandboxManager, n: int) -> list[float]:
    """Seconds of ``n`` closes, one at a time, of sandboxes like the rollouts' (bwrap), each
    with its shell and a background process live."""
    seconds = []
    for _ in range(n):
        sandbox = await manager.start(spec_for("bwrap"))
        session = await ShellSession.open(sandbox)
        try:
            await session.run("sleep 600 &")
            start = time.perf_counter()
            await sandbox.close()  # what the manager's close does, left out of its own figures
            seconds.append(time.perf_counter() - start)
        finally:
            await session.close()
            await sandbox.close()
    return seconds


async def _at_checkpoint(
    model: ScriptedToolBackend, manager: SandboxManager
) -> tuple[TreeMemory, list[float]]:
    """While the model holds every rollout at the checkpoint turn (its sandbox and shell
    live): the tree's memory, read in a thread of its own (the default executor is the one
    rollserve uses), then the probe closes. The held calls go on afterwards."""
    try:
        await model.checkpoint.wait()
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="bench-memory") as pool:
            memory = await loop.run_in_executor(pool, tree_memory)
        return memory, await _probe_closes(manager, PROBE_CLOSES)
    finally:
        model.measured.set()


async def _step(n: int, workload: ScaleWorkload) -> ScaleStep:
    script = ModelScript(
        commands=tuple(COMMANDS[i % len(COMMANDS)] for i in range(workload.turns - 1)),
        latency_s=workload.model_ms / 1000,
        jitter=workload.jitter,
        barrier=n,
        barrier_timeout_s=workload.barrier_timeout_s,
        checkpoint=min(2, workload.turns - 1),
    )
    async with Rig(
        script,
        init_workers=min(n, workload.init_workers),
        run_workers=n,
        eval_workers=min(n, workload.eval_workers),
    ) as rig:
        busy: list[float] = []
        rig.sandboxes.close_times = busy
        async with rig.pipelined():
            sandboxes = Sampler(lambda: len(rig.sandboxes.live), interval_s=0.1)
            sandboxes.start()
            checkpoint = asyncio.create_task(_at_checkpoint(rig.model, rig.sandboxes))
            start = time.perf_counter()
            ids = await rig.submit([echo_job(i, turns=workload.turns) for i in range(n)])
            records = await rig.finished(ids, timeout_s=3600, poll_s=0.5)
            seconds = time.perf_counter() - start
            peak = await sandboxes.stop()
            if not checkpoint.done():  # the checkpoint was never reached
                checkpoint.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checkpoint
            mem, closes = (
                checkpoint.result() if not checkpoint.cancelled() else (TreeMemory(0, 0, 0), [])
            )
        completed = errors = retried = 0
        latencies: list[float] = []
        for record in records:
            result = record.rollout_result()
            if record.status != JobStatus.COMPLETED or result is None or result.reward != 1.0:
                errors += 1
                continue
            completed += 1
            errors += result.tool_errors
            retried += record.attempts > 1  # its lease was lost and the job ran again
            if record.finished is not None:
                latencies.append(record.finished - record.created - record.timing["queued_s"])
        errors += n - len(records)
        turns = [
            log.starts[k + 1] - log.ends[k]
            for log in rig.model.logs
            for k in range(1, min(len(log.ends), len(log.starts) - 1))
        ]
        return ScaleStep(
            rollouts=n,
            concurrent=rig.model.barrier_reached,
            completed=completed,
            errors=errors + retried,
            retried=retried,
            seconds=round(seconds, 2),
            rollouts_per_s=round(completed / seconds, 2),
            p50_s=round(quantile(latencies, 0.5), 3),
            p99_s=round(quantile(latencies, 0.99), 3),
            turn_p50_ms=round(quantile(turns, 0.5) * 1000, 2),
            turn_p99_ms=round(quantile(turns, 0.99) * 1000, 2),
            close_p50_ms=round(quantile(closes, 0.5) * 1000, 2),
            close_p99_ms=round(quantile(closes, 0.99) * 1000, 2),
            busy_close_p50_ms=round(quantile(busy, 0.5) * 1000, 2),
            busy_close_p99_ms=round(quantile(busy, 0.99) * 1000, 2),
            peak_sandboxes=peak,
            processes=mem.processes,
            rss_mib=round(mem.rss_kib / _MIB, 1),
            pss_mib=round(mem.pss_kib / _MIB, 1),
        )


async def bench_scale(workload: ScaleWorkload) -> ScaleBenchResult:
    """Every step, smallest first; steps go on after one with errors, to show the trend."""
    nofile = raise_nofile()
    steps = [await _step(n, workload) for n in workload.steps()]
    sustained = [s.rollouts for s in steps if s.errors == 0 and s.concurrent == s.rollouts]
    return ScaleBenchResult(
        user=running_user(),
        turns=workload.turns,
        model_latency_ms=workload.model_ms,
        nofile_limit=nofile,
        steps=steps,
        max_sustained=max(sustained, default=0),
    )


def scale_table(result: ScaleBenchResult) -> Table:
    """The steps as a table."""
    table = Table(
        "rollouts",
        "at once",
        "errors (run twice)",
        "p50/p99 s",
        "rollouts/s",
        "turn p50/p99 ms",
        "close p50/p99 ms (busy)",
        "processes",
        "RSS/PSS MiB",
        caption=(
            f"as {result.user}; {result.turns} model calls of "
            f"{result.model_latency_ms:g} ms per rollout; "
            f"open-files limit {result.nofile_limit}; largest step without errors: "
            f"{result.max_sustained}"
        ),
    )
    for s in result.steps:
        table.add_row(
            str(s.rollouts),
            str(s.concurrent),
            f"{s.errors} ({s.retried})",
            f"{s.p50_s:.1f}/{s.p99_s:.1f}",
            f"{s.rollouts_per_s:.1f}",
            f"{s.turn_p50_ms:.0f}/{s.turn_p99_ms:.0f}",
            f"{s.close_p50_ms:.1f}/{s.close_p99_ms:.1f} "
            f"({s.busy_close_p50_ms:.0f}/{s.busy_close_p99_ms:.0f})",
            str(s.processes),
            f"{s.rss_mib:.0f}/{s.pss_mib:.0f}",
        )
    return table
