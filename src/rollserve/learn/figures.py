"""What ``rollserve bench learn`` reports: per step, per run, and for the whole bench."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Mode = Literal["synchronous", "decoupled"]


class LearnPlan(BaseModel):
    """What every run of one bench does alike."""

    steps: int
    prompts: int  # per step
    generations: int  # per prompt (a GRPO group)
    lr: float
    adam_eps: float  # large: parameters with small, noisy gradients move little
    beta: float  # the KL penalty toward the starting policy
    seed: int
    eval_every: int
    decoupled_threads: int  # the trainer's torch threads when rollouts run beside its updates


class StepFigures(BaseModel):
    """One optimizer step."""

    step: int
    train_reward: float
    heldout_reward: float | None = None
    step_s: float  # from the previous step's end (its evaluation excluded) to this one's
    rollout_s: float  # waiting for the batch's rollouts
    update_s: float  # TRL's loss, backward and optimizer step, and what else is not waiting
    sync_s: float  # pause, weight load into the inference server, resume
    stale_turns: float  # share of the batch's model turns made by an older policy
    prefetched: bool


class RunFigures(BaseModel):
    """One run: its held-out rewards, its steps and its times."""

    mode: Mode
    trainer_threads: int
    heldout_before: float
    heldout_after: float
    steps: list[StepFigures]
    wall_s: float
    train_s: float  # wall time without the held-out evaluations
    step_s: float  # median step, steps followed by no evaluation
    rollout_s: float  # totals over the run
    update_s: float
    sync_s: float
    eval_s: float
