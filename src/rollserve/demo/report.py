"""What ``rollserve demo`` shows of its jobs: live progress by stage while they run, then a
summary per GRPO group (rewards, exit reasons, stage timings, tokens) and the throughput; and
the trajectories file (one full JobView per line, token ids included)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from types import MappingProxyType

from rich import box
from rich.console import Group
from rich.table import Column, Table
from rich.text import Text

from rollserve.schema.jobs import TERMINAL, JobStatus, JobView
from rollserve.schema.status import StageLoad

STATUSES = tuple(status.value for status in JobStatus)
_STYLE = MappingProxyType(
    {
        "queued": "dim",
        "initializing": "cyan",
        "running": "yellow",
        "evaluating": "magenta",
        "completed": "green",
        "failed": "red",
        "cancelled": "red",
        "stale": "red",
    }
)


def generated_tokens(job: JobView) -> int:
    """Tokens the model generated in the job (token mode; 0 in text mode)."""
    tokens = job.result.tokens if job.result else None
    return sum(turn.generated_tokens for turn in tokens.turns) if tokens else 0


def tool_calls(job: JobView) -> int:
    """Well-formed tool calls the model made."""
    if job.result is None:
        return 0
    return sum(len(m.tool_calls or []) for m in job.result.messages)


@dataclass
class Board:
    """The jobs of one submission as last seen, in submission order."""

    job_ids: list[str]
    started: float = field(default_factory=time.monotonic)
    views: dict[str, JobView] = field(default_factory=dict)
    ended: float | None = None
    stages: dict[str, StageLoad] = field(default_factory=dict)  # from GET /v1/status

    @property
    def pending(self) -> list[str]:
        return [j for j in self.job_ids if j not in self.views or not self.finished(j)]

    def finished(self, job_id: str) -> bool:
        view = self.views.get(job_id)
        return view is not None and view.status in TERMINAL

    def update(self, view: JobView) -> str | None:
        """Record a view; a line saying what changed, if its status did."""
        before = self.views.get(view.job_id)
        self.views[view.job_id] = view
        if not self.pending and self.ended is None:
            self.ended = time.monotonic()
        if before is not None and before.status == view.status:
            return None
        line = f"{time.monotonic() - self.started:6.1f}s  {view.job_id}: {view.status}"
        if view.result is not None:
            line += f" (reward {view.result.reward:g}, {view.result.exit_reason.value})"
        elif view.error is not None:
            line += f" ({view.error.code}: {view.error.message[:120]})"
        return line

    def render(self) -> Group:
        """Jobs by status, the service's pools (busy workers / waiting jobs), a row per job."""
        counts = Counter(v.status for v in self.views.values())
        head = Text(f"{time.monotonic() - self.started:.0f}s  ")
        for status in STATUSES:
            head.append(f"{status} {counts.get(status, 0)}  ", style=_STYLE[status])
        pools = Text("pools: ")
        for stage, load in self.stages.items():
            pools.append(f"{stage} {load.active}/{load.workers} busy, {load.queued} waiting   ")
        table = Table("job", "status", "attempts", "reward", "exit", "turns", "tokens")
        for job_id in self.job_ids:
            view = self.views.get(job_id)
            status = view.status if view else "queued"
            result = view.result if view else None
            table.add_row(
                job_id,
                Text(status, style=_STYLE.get(status, "")),
                str(view.attempts) if view else "",
                f"{result.reward:g}" if result else "",
                result.exit_reason.value if result else "",
                str(result.turns) if result else "",
                str(generated_tokens(view)) if view and result else "",
            )
        return Group(head, pools, table)


def _counted(values: list[str]) -> str:
    """``2 a, 1 b`` for ``[a, a, b]``, in first-seen order."""
    return ", ".join(f"{n} {v}" for v, n in Counter(values).items())


def summary_tables(groups: list[tuple[str, str, list[JobView]]]) -> Group:
    """Outcomes, then mean stage timings, one row per GRPO group ``(group_id, family, jobs)``;
    two tables so that each reads at 80 columns."""
    outcomes = Table(
        Column("group", overflow="fold"),
        *(
            Column(name, no_wrap=True)
            for name in ("family", "rewards", "exit reasons", "turns", "tools", "tokens")
        ),
        title="rollouts by GRPO group (tools: tool calls made; tokens: tokens generated)",
        box=box.SIMPLE_HEAD,
    )
    timings = Table(
        Column("group", overflow="fold"),
        *(Column(f"{stage} s", justify="right") for stage in ("queued", "init", "run", "eval")),
        title="stage timings by group (mean seconds)",
        box=box.SIMPLE_HEAD,
    )
    stages = ("queued_s", "init_s", "run_s", "eval_s")
    for group, family, jobs in groups:
        results = [j.result for j in jobs if j.result is not None]
        rewards = [f"{j.result.reward:g}" if j.result else "-" for j in jobs]
        reasons = [
            j.result.exit_reason.value if j.result else (j.error.code if j.error else j.status)
            for j in jobs
        ]
        outcomes.add_row(
            group,
            family,
            " ".join(rewards),
            _counted(reasons),
            " ".join(str(r.turns) for r in results) or "-",
            str(sum(tool_calls(j) for j in jobs)),
            str(sum(generated_tokens(j) for j in jobs)),
        )
        timings.add_row(
            group,
            *(f"{mean(getattr(j.timing, s) for j in jobs):.1f}" if jobs else "-" for s in stages),
        )
    return Group(outcomes, timings)


def throughput(board: Board) -> Text:
    """Rollouts per minute and generated tokens per second over the rollouts' wall time."""
    views = [board.views[j] for j in board.job_ids if j in board.views]
    wall = (board.ended or time.monotonic()) - board.started
    completed = sum(v.status == "completed" for v in views)
    tokens = sum(generated_tokens(v) for v in views)
    calls = sum(len(v.result.tokens.turns) for v in views if v.result and v.result.tokens)
    text = Text(f"{completed}/{len(board.job_ids)} rollouts completed in {wall:.0f} s: ")
    text.append(f"{60 * completed / wall:.1f} rollouts/min", style="bold")
    text.append(f", {tokens} tokens generated in {calls} model calls, ")
    text.append(f"{tokens / wall:.1f} generated tokens/s", style="bold")
    return text


def write_trajectories(path: Path, views: list[JobView]) -> None:
    """One full JobView per line (messages, token ids, masks, logprobs, timings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(view.model_dump_json() + "\n" for view in views))
