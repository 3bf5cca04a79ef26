"""One training run of ``rollserve bench learn``: TRL's ``GRPOTrainer`` trains the policy on
``lookup`` episodes that a ``rollserve serve`` runs (real sandboxes, the tool agent, rollserve's
evaluation), against the policy's own inference server in token mode. After each optimizer step
the trainer pauses the model in rollserve (calls in flight finish), loads its new weights into
the inference server and resumes the model with the step as its policy version.

``synchronous`` generates each batch when the trainer asks for it; ``decoupled`` generates the
next batch while the trainer updates (``RollserveRollout(prefetch=True)``)."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollserve.client import RolloutClient
from rollserve.client.trl import RollserveRollout, rollserve_reward
from rollserve.learn.figures import LearnPlan, Mode, RunFigures
from rollserve.learn.tasks import LookupInstance
from rollserve.ports import free_port
from rollserve.schema.backends import BackendSpec
from rollserve.schema.jobs import JobRequest

AGENT = {"name": "tool", "max_turns": 2}
TURN_TOKENS = 40


def behaviour_clipped(trainer_class: Any) -> Any:
    """``GRPOTrainer`` whose PPO ratio is taken against the policy that generated each token
    (the logprobs rollserve returns), not against the weights being trained: a batch generated
    one update earlier (decoupled) is then clipped as PPO clips off-policy tokens, instead of
    counting as on-policy. For a batch of the current weights the ratio is 1, as before."""

    class BehaviourClipped(trainer_class):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            output = super()._generate_and_score_completions(inputs)
            behaviour = output.get("sampling_per_token_logps")
            if behaviour is not None and output.get("old_per_token_logps") is None:
                output["old_per_token_logps"] = behaviour
            return output

    return BehaviourClipped


def policy_server(model_dir: Path, name: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``rollserve llm serve`` for the policy (one CPU thread), and its URL."""
    port = free_port()
    command = [sys.executable, "-m", "rollserve.cli.app", "llm", "serve", "--model"]
    command += [str(model_dir), "--port", str(port), "--served-model-name", name]
    command += ["--threads", "1"]
    with open(log, "wb") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return child, url
        except httpx.HTTPError:
            pass
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            child.wait()
            raise RuntimeError(f"the policy server did not start (log: {log})")
        time.sleep(0.2)


def heldout_reward(
    client: RolloutClient, heldout: list[LookupInstance], model: str, tag: str
) -> float:
    """Mean reward of one sampled episode (temperature 1, a fixed seed per instance) on each
    held-out instance."""
    requests: list[JobRequest | dict[str, Any]] = [
        JobRequest.model_validate(
            {
                "job_id": f"{tag}-{index}",
                "task": instance.task(),
                "agent": AGENT,
                "sampling": {"max_tokens": TURN_TOKENS, "temperature": 1.0, "seed": index},
                "model": model,
            }
        )
        for index, instance in enumerate(heldout)
    ]
    accepted = client.submit_batch(requests)
    rewards = []
    for answer in accepted:
        view = client.wait(answer.job_id, timeout=600)
        if view.status != "completed" or view.result is None:
            raise RuntimeError(f"held-out rollout {view.job_id} ended {view.status}: {view.error}")
        rewards.append(view.result.reward)
    return round(sum(rewards) / len(rewards), 4)


@contextlib.contextmanager
def trainer_threads(mode: Mode, plan: LearnPlan) -> Iterator[int]:
    """The trainer's torch threads for a run of ``mode``: the decoupled run leaves the other
    cores to the rollouts that run beside its updates. Restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    if mode == "decoupled":
        torch.set_num_threads(min(threads, plan.decoupled_threads))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)


def train_run(
    mode: Mode,
    plan: LearnPlan,
    url: str,
    policy: Path,
    work: Path,
    train: list[LookupInstance],
    heldout: list[LookupInstance],
) -> RunFigures:
    """Train a copy of ``policy`` in ``mode``; the figures of the run."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rollserve.learn.sync import WeightSync

    work.mkdir(parents=True)
    model_dir = work / "policy"
    shutil.copytree(policy, model_dir)
    name = f"policy-{mode}"
    started = time.monotonic()
    server, server_url = policy_server(model_dir, name, work / "policy-server.log")
    try:
        with RolloutClient(url, timeout=120) as client:
            client.register_backend(
                BackendSpec(
                    id=name,
                    kind="vllm",
                    url=f"{server_url}/v1",
                    model=name,
                    tokenizer=str(model_dir),
                    policy_version=0,
                )
            )

            def evaluate(step: int) -> float:
                return heldout_reward(client, heldout, name, f"{name}-h{step}")

            eval_started = time.monotonic()
            before = evaluate(0)
            rows = [{"prompt": i.prompt} for i in train]
            tasks = {i.prompt: i.task() for i in train}
            rollout = RollserveRollout(
                client,
                lambda row: tasks[row["prompt"]],
                model=name,
                agent=AGENT,
                sampling={"max_tokens": TURN_TOKENS, "temperature": 1.0},
                rows=rows,
                timeout=600,
                run_id=name,
                prefetch=mode == "decoupled",
            )
            sync = WeightSync(client, name, server_url, work / "weights", plan, evaluate)
            sync.eval_s = time.monotonic() - eval_started
            config = GRPOConfig(
                output_dir=str(work / "trl"),
                per_device_train_batch_size=plan.prompts * plan.generations,
                num_generations=plan.generations,
                max_steps=plan.steps,
                learning_rate=plan.lr,
                lr_scheduler_type="constant",
                adam_epsilon=plan.adam_eps,
                beta=plan.beta,
                temperature=1.0,
                max_completion_length=256,
                shuffle_dataset=False,
                logging_steps=1,
                report_to="none",
                save_strategy="no",
                use_cpu=True,
                bf16=False,
                seed=plan.seed,
                disable_tqdm=True,
            )
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*experimental feature.*")
                trainer = behaviour_clipped(GRPOTrainer)(
                    model=model,
                    processing_class=AutoTokenizer.from_pretrained(model_dir),
                    reward_funcs=[rollserve_reward],
                    args=config,
                    train_dataset=Dataset.from_list(rows),
                    rollout_func=rollout,
                    callbacks=[sync],
                )
            try:
                with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its logs
                    trainer.train()
            finally:
                rollout.cancel()
            client.remove_backend(name)
    finally:
        server.terminate()
        server.wait(timeout=30)
    wall = time.monotonic() - started
    steps = sync.figures(rollout.calls)
    plain = [s.step_s for s in steps[1:] if steps[s.step - 2].heldout_reward is None]
    return RunFigures(
        mode=mode,
        trainer_threads=torch.get_num_threads(),
        heldout_before=before,
        heldout_after=sync.heldout[-1][1] if sync.heldout else before,
        steps=steps,
        wall_s=round(wall, 2),
        train_s=round(wall - sync.eval_s, 2),
        step_s=round(statistics.median(plain or [s.step_s for s in steps]), 3),
        rollout_s=round(sum(s.rollout_s for s in steps), 2),
        update_s=round(sum(s.update_s for s in steps), 2),
        sync_s=round(sum(s.sync_s for s in steps), 2),
        eval_s=round(sync.eval_s, 2),
    )
