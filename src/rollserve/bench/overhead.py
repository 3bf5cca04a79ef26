"""``rollserve bench overhead``: what rollserve itself costs per agent turn and per job, with a
model that answers at once.

- *turn*: the tool agent's loop in a bwrap sandbox, each turn an instant model call (through
  the real Router and model session) that asks for ``bash`` ``true``; timed from one model call
  to the next, so a turn holds the model call, the tool call, the shell round trip and the
  agent's bookkeeping. The first two turns (the shell starts in the first) are left out.
- *turn without command*: the same loop, each call naming a tool that does not exist (the
  agent answers with an error observation and runs nothing).
- *shell*: ``true`` in a persistent shell of a bwrap sandbox on its own (``ShellSession.run``),
  the command's round trip that a turn contains.
- *job*: one job at a time, submitted to the scheduler and waited for as a client would: an
  ``echo`` task without delays (a run sandbox and a fresh evaluation sandbox), two instant
  model calls (``true``, then submit).
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

from rich.table import Table

from rollserve.bench.model import ModelScript
from rollserve.bench.pipeline import one_rollout
from rollserve.bench.rig import Rig, echo_job
from rollserve.bench.stats import quantiles_ms
from rollserve.errors import InfrastructureError
from rollserve.sandbox import spec_for
from rollserve.schema.bench import OverheadBenchResult
from rollserve.shell import ShellSession
from rollserve.storage import JobStatus

_WARM_TURNS = 2  # the shell starts in the first bash turn


@dataclass(frozen=True)
class OverheadWorkload:
    """How much each figure samples."""

    turns: int = 100  # model calls per rollout
    rollouts: int = 5
    shell_n: int = 500
    jobs: int = 40
    job_turns: int = 2


async def _turn_times(tool: str, workload: OverheadWorkload) -> list[float]:
    script = ModelScript(commands=("true",) * (workload.turns - 1), tool=tool)
    samples: list[float] = []
    async with Rig(script) as rig:
        for index in range(workload.rollouts):
            request = echo_job(index, turns=workload.turns)
            result = await one_rollout(rig.runner, request)
            expected_errors = workload.turns - 1 if tool != "bash" else 0
            if result.reward != 1.0 or result.tool_errors != expected_errors:
                raise InfrastructureError(
                    f"overhead rollout {index} went wrong: reward {result.reward}, "
                    f"{result.tool_errors} tool errors"
                )
        for log in rig.model.logs:
            starts = log.starts[_WARM_TURNS:]
            samples += [b - a for a, b in itertools.pairwise(starts)]
    return samples


async def _shell_times(n: int) -> list[float]:
    async with Rig(ModelScript(commands=())) as rig:
        sandbox = await rig.sandboxes.start(spec_for("bwrap"))
        try:
            session = await ShellSession.open(sandbox)
            try:
                for _ in range(min(20, n)):
                    await session.run("true")
                samples = []
                for _ in range(n):
                    start = time.perf_counter()
                    await session.run("true")
                    samples.append(time.perf_counter() - start)
                return samples
            finally:
                await session.close()
        finally:
            await rig.sandboxes.close(sandbox)


async def _job_times(workload: OverheadWorkload) -> tuple[list[float], dict[str, float]]:
    script = ModelScript(commands=("true",) * (workload.job_turns - 1))
    totals: list[float] = []
    parts: dict[str, list[float]] = {"init": [], "run": [], "eval": [], "rest": []}
    async with Rig(script) as rig, rig.pipelined():
        for index in range(workload.jobs + 1):  # the first one warms up
            request = echo_job(index, turns=workload.job_turns)
            start = time.perf_counter()
            ids = await rig.submit([request])
            [record] = await rig.finished(ids, timeout_s=120)
            total = time.perf_counter() - start
            if record.status != JobStatus.COMPLETED:
                raise InfrastructureError(f"overhead job {index} ended {record.status}")
            if index == 0:
                continue
            totals.append(total)
            stages = {k: record.timing.get(f"{k}_s", 0.0) for k in ("init", "run", "eval")}
            for name, seconds in stages.items():
                parts[name].append(seconds)
            parts["rest"].append(total - sum(stages.values()))
    medians = {k: round(statistics.median(v) * 1000, 3) for k, v in parts.items()}
    return totals, medians


async def bench_overhead(workload: OverheadWorkload) -> OverheadBenchResult:
    """Turn, shell and job figures, measured one after another."""
    turn = quantiles_ms(await _turn_times("bash", workload))
    bare = quantiles_ms(await _turn_times("nothing", workload))
    shell = quantiles_ms(await _shell_times(workload.shell_n))
    jobs, stages = await _job_times(workload)
    return OverheadBenchResult(
        turn=turn,
        turn_without_command=bare,
        shell=shell,
        overhead_per_turn_p50_ms=round(turn.p50_ms - shell.p50_ms, 3),
        job=quantiles_ms(jobs),
        job_stages_p50_ms=stages,
        job_turns=workload.job_turns,
    )


def overhead_table(result: OverheadBenchResult) -> Table:
    """The figures as a table."""
    table = Table(
        "what",
        "p50 ms",
        "p99 ms",
        "n",
        caption=(
            f"rollserve's own cost per turn (turn p50 - shell p50): "
            f"{result.overhead_per_turn_p50_ms:.3f} ms. Job ({result.job_turns} instant model "
            "calls), p50 by stage (ms): "
            + ", ".join(f"{k} {v:.1f}" for k, v in result.job_stages_p50_ms.items())
        ),
    )
    rows = [
        ("turn: instant model + bash true", result.turn),
        ("turn: instant model, no command", result.turn_without_command),
        ("shell round trip of true alone", result.shell),
        ("job: submit -> completed", result.job),
    ]
    for name, figures in rows:
        table.add_row(name, f"{figures.p50_ms:.3f}", f"{figures.p99_ms:.3f}", str(figures.n))
    return table
