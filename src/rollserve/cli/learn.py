"""``rollserve bench learn``: train a tiny policy with TRL's GRPO through rollserve and show
that it learns (held-out reward before and after, curves in a PNG), synchronous and decoupled
side by side. Needs the ``train`` extra (torch, TRL, matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rollserve.learn.figures import LearnPlan, Mode
from rollserve.learn.main import LearnResult, bench_learn


def learn_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    out: Annotated[
        Path, typer.Option("--out", help="where the plot, the JSON and the server's log go")
    ] = Path("rollserve-learn"),
    steps: Annotated[int, typer.Option("--steps", min=1, help="optimizer steps per run")] = 40,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="tasks per step")] = 4,
    generations: Annotated[
        int, typer.Option("--generations", min=2, help="samples per task (a GRPO group)")
    ] = 8,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="learning rate")] = 2e-3,
    adam_eps: Annotated[
        float, typer.Option("--adam-eps", min=0.0, help="Adam's epsilon (a large one calms noise)")
    ] = 1e-3,
    beta: Annotated[
        float, typer.Option("--beta", min=0.0, help="KL penalty toward the starting policy")
    ] = 0.04,
    eval_every: Annotated[
        int, typer.Option("--eval-every", min=1, help="steps between held-out evaluations")
    ] = 5,
    heldout: Annotated[int, typer.Option("--heldout", min=1, help="held-out instances")] = 64,
    copy_steps: Annotated[
        int, typer.Option("--copy-steps", min=0, help="warm start: batches of copy snippets")
    ] = 300,
    warm_steps: Annotated[
        int, typer.Option("--warm-steps", min=0, help="warm start: batches of episodes")
    ] = 300,
    mode: Annotated[
        list[str] | None,
        typer.Option(
            "--mode", help="decoupled and/or synchronous, in this order (the first: the main run)"
        ),
    ] = None,
    decoupled_threads: Annotated[
        int,
        typer.Option(
            "--decoupled-threads", min=1, help="the trainer's torch threads in the decoupled run"
        ),
    ] = 1,
    seed: Annotated[int, typer.Option("--seed", help="tasks, weights and sampling")] = 0,
) -> None:
    """Train through rollserve and measure the held-out reward; synchronous vs decoupled."""
    modes: list[Mode] = []
    for name in mode or ["decoupled", "synchronous"]:
        if name not in ("synchronous", "decoupled"):
            raise typer.BadParameter(f"{name!r}: the modes are synchronous and decoupled")
        modes.append("synchronous" if name == "synchronous" else "decoupled")
    plan = LearnPlan(
        steps=steps,
        prompts=prompts,
        generations=generations,
        lr=lr,
        adam_eps=adam_eps,
        beta=beta,
        seed=seed,
        eval_every=eval_every,
        decoupled_threads=decoupled_threads,
    )
    result = bench_learn(
        plan,
        out,
        modes=tuple(modes),
        heldout=heldout,
        copy_steps=copy_steps,
        warm_steps=warm_steps,
    )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(learn_table(result))


def learn_table(result: LearnResult) -> Table:
    table = Table(title=f"rollserve bench learn (plot: {result.plot})")
    for column in ("run", "held-out before", "held-out after", "s/step", "rollout s", "update s"):
        table.add_column(column)
    for run in result.runs:
        table.add_row(
            run.mode,
            f"{run.heldout_before:.3f}",
            f"{run.heldout_after:.3f}",
            f"{run.step_s:.2f}",
            f"{run.rollout_s:.1f}",
            f"{run.update_s:.1f}",
        )
    return table
