"""The work of ``rollserve demo``: which shipped tasks it runs, the SWE tasks prepared once into
the demo directory, and the GRPO groups it submits (one group per task, several samples each,
with limits sized for a small model on a few CPU cores)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rollserve.schema.jobs import AgentConfig, JobRequest, Sampling, StageTimeouts, Task

SWE = "swe"  # a pick from the prepared SWE tasks rather than from a file of examples/


@dataclass(frozen=True)
class Pick:
    """One shipped task the demo runs: its family (a label), file under examples/, id."""

    family: str
    path: str
    task_id: str


@dataclass(frozen=True)
class Limits:
    """An episode's limits: the agent's turns and token budget, the sampling of each turn."""

    max_turns: int
    context_tokens: int  # the whole trajectory: prompt, replies and observations
    turn_tokens: int
    temperature: float = 0.7
    top_p: float = 0.95
    command_timeout_s: float = 20.0
    # Small models rarely call a tool; a reply without one then gets "call a tool" (template
    # tokens, mask 0) and the episode goes on, so the trajectories are multi-turn.
    end_without_tool_call: bool = False


FULL = (
    Pick("math", "math/tasks.jsonl", "compmath/hmmt_N_2024_guts_9"),
    Pick("math", "math/tasks.jsonl", "compmath/hmmt_N_2024_guts_10"),
    Pick("humaneval", "humaneval/tasks.jsonl", "HumanEval/53"),
    Pick("stdio", "code/stdio.jsonl", "stdio/pair-sums"),
    Pick("swe", SWE, "more-itertools-value-chain-typeerror"),
)
FAST = (
    Pick("math", "math/tasks.jsonl", "compmath/hmmt_N_2024_guts_9"),
    Pick("humaneval", "humaneval/tasks.jsonl", "HumanEval/53"),
)
# A 135M model makes ~8 tokens/s on two cores and reads a prompt at ~300 tokens/s; the tool
# schemas alone take 400-800 tokens. Three short turns take about 30 s per rollout.
FULL_LIMITS = Limits(max_turns=3, context_tokens=1600, turn_tokens=64)
FAST_LIMITS = Limits(max_turns=2, context_tokens=2048, turn_tokens=24)


def group_id(task_id: str) -> str:
    """A group id fit for a URL path segment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", task_id).strip("-")


def load_task(path: Path, task_id: str) -> Task:
    """The task ``task_id`` of a JSONL file of tasks."""
    for line in path.read_text().splitlines():
        if line.strip() and json.loads(line).get("task_id") == task_id:
            return Task.model_validate_json(line)
    raise FileNotFoundError(f"{path} has no task {task_id!r}")


def prepared_swe(out: Path, task_id: str) -> Task | None:
    """The SWE task from an earlier preparation under ``out``, when it is still all there."""
    tasks = out / "tasks.jsonl"
    if not tasks.is_file():
        return None
    try:
        task = load_task(tasks, task_id)
    except FileNotFoundError:
        return None
    fields = task.model_extra or {}
    ready = all(Path(str(fields.get(name, ""))).is_dir() for name in ("repo", "env"))
    return task if ready else None


def job_requests(
    tasks: list[tuple[Pick, Task]], samples: int, model: str, limits: Limits
) -> list[JobRequest]:
    """``samples`` jobs per task, one GRPO group per task; each sample its own seed."""
    agent = AgentConfig.model_validate(
        {
            "name": "tool",
            "max_turns": limits.max_turns,
            "max_tokens": limits.context_tokens,
            "command_timeout_s": limits.command_timeout_s,
            "end_without_tool_call": limits.end_without_tool_call,
        }
    )
    # Safety nets only: a run's time includes its wait for the one model server.
    timeouts = StageTimeouts(init_s=120, run_s=900, eval_s=300)
    jobs = []
    for number, (pick, task) in enumerate(tasks):
        group = group_id(pick.task_id)
        for sample in range(samples):
            sampling = Sampling(
                temperature=limits.temperature,
                top_p=limits.top_p,
                max_tokens=limits.turn_tokens,
                seed=1000 * number + sample,
            )
            jobs.append(
                JobRequest(
                    job_id=f"{group}-s{sample}",
                    group_id=group,
                    task=task,
                    agent=agent,
                    sampling=sampling,
                    model=model,
                    timeouts=timeouts,
                    metadata={"demo_family": pick.family},
                )
            )
    return jobs
