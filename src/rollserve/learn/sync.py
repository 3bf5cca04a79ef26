"""The trainer's side of a weight update in ``rollserve bench learn``: a TRL callback that, after
each optimizer step, pauses the policy's model in rollserve (its calls in flight finish, new ones
wait), loads the new weights into the inference server (SGLang's ``/update_weights_from_disk``,
which rollserve's local server speaks), resumes the model with the step as its policy version,
and now and then measures the held-out reward. It times each part of each step."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from transformers import TrainerCallback

from rollserve.client import RolloutClient
from rollserve.client.trl import RolloutCall
from rollserve.learn.figures import LearnPlan, StepFigures


class WeightSync(TrainerCallback):
    """Publishes each step's weights to the policy's inference server through rollserve's
    pause/resume contract; evaluates every ``plan.eval_every`` steps and after the last."""

    def __init__(
        self,
        client: RolloutClient,
        model: str,
        server_url: str,
        weights: Path,
        plan: LearnPlan,
        evaluate: Callable[[int], float],
    ) -> None:
        self.client, self.model, self.server_url = client, model, server_url
        self.weights, self.plan, self.evaluate = weights, plan, evaluate
        self.steps: list[tuple[float, float]] = []  # each step's seconds and its sync's
        self.heldout: list[tuple[int, float]] = []
        self.eval_s = 0.0
        self._begin = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._begin = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        computed = time.monotonic()
        self.publish(kwargs["model"], step)
        ended = time.monotonic()
        self.steps.append((ended - self._begin, ended - computed))
        if step % self.plan.eval_every == 0 or step == self.plan.steps:
            self.heldout.append((step, self.evaluate(step)))
            self.eval_s += time.monotonic() - ended
        self._begin = time.monotonic()  # the next step starts after the evaluation

    def figures(self, calls: list[RolloutCall]) -> list[StepFigures]:
        """Each step's figures, its rollouts from ``calls`` (one per step)."""
        heldout = dict(self.heldout)
        out = []
        for index, ((step_s, sync_s), call) in enumerate(zip(self.steps, calls, strict=False)):
            turns = [v for sample in call.policy_versions for v in sample]
            stale = sum(1 for v in turns if v is not None and v < index)
            out.append(
                StepFigures(
                    step=index + 1,
                    train_reward=round(sum(call.rewards) / len(call.rewards), 4),
                    heldout_reward=heldout.get(index + 1),
                    step_s=round(step_s, 3),
                    rollout_s=round(call.seconds, 3),
                    update_s=round(step_s - call.seconds - sync_s, 3),
                    sync_s=round(sync_s, 3),
                    stale_turns=round(stale / max(len(turns), 1), 3),
                    prefetched=call.prefetched,
                )
            )
        return out

    def publish(self, model: Any, step: int) -> None:
        """Pause, load the step's weights into the inference server, resume at ``step``."""
        target = self.weights / f"step-{step}"
        model.save_pretrained(target)
        self.client.pause_model(self.model, "wait")
        try:
            answer = httpx.post(
                f"{self.server_url}/update_weights_from_disk",
                json={"model_path": str(target), "weight_version": str(step)},
                timeout=120,
            )
            answer.raise_for_status()
        except httpx.HTTPError:
            self.client.resume_model(self.model)  # the old weights, under their old version
            raise
        self.client.resume_model(self.model, policy_version=step)
        previous = self.weights / f"step-{step - 1}"
        shutil.rmtree(previous, ignore_errors=True)
