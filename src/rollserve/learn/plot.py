"""The learning curves of ``rollserve bench learn`` as a PNG: reward by optimizer step (training
batches and held-out instances), and held-out reward by wall time, one line per run."""

from __future__ import annotations

from pathlib import Path

from rollserve.learn.figures import RunFigures

_COLOURS = {"synchronous": "#1f77b4", "decoupled": "#d62728"}


def plot_runs(runs: list[RunFigures], path: Path) -> Path:
    """Draw ``runs`` into ``path`` (PNG); matplotlib draws off-screen (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (by_step, by_time) = pyplot.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    for run in runs:
        colour = _COLOURS.get(run.mode, "black")
        steps = [s.step for s in run.steps]
        by_step.plot(
            steps,
            [s.train_reward for s in run.steps],
            color=colour,
            alpha=0.35,
            linewidth=1,
            label=f"{run.mode}: training batches",
        )
        held = [(0, run.heldout_before)] + [
            (s.step, s.heldout_reward) for s in run.steps if s.heldout_reward is not None
        ]
        by_step.plot(
            [h[0] for h in held],
            [h[1] for h in held],
            color=colour,
            marker="o",
            linewidth=2,
            label=f"{run.mode}: held-out",
        )
        seconds, clock = [0.0], 0.0
        for figures in run.steps:
            clock += figures.step_s
            if figures.heldout_reward is not None:
                seconds.append(clock)
        by_time.plot(
            seconds[: len(held)],
            [h[1] for h in held],
            color=colour,
            marker="o",
            linewidth=2,
            label=f"{run.mode} ({run.step_s:.2f} s/step)",
        )
    by_step.set(xlabel="optimizer step", ylabel="mean reward", ylim=(-0.02, 1.02))
    by_step.set_title("reward by step")
    by_time.set(xlabel="training seconds (held-out evaluations left out)", ylabel="held-out reward")
    by_time.set_ylim(-0.02, 1.02)
    by_time.set_title("held-out reward by training time")
    for axes in (by_step, by_time):
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right", fontsize=8)
    figure.suptitle("TRL GRPO through rollserve: lookup tasks in bwrap sandboxes, tiny policy")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    pyplot.close(figure)
    return path
