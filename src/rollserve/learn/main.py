"""``rollserve bench learn``: training that learns through rollserve, on this machine's CPUs.

A tiny policy (``rollserve.llm.local.tiny_model``, the ``learner`` variant) is taught the tool
format by imitation of a random file reader (``policy``), then trained with TRL's GRPO on
``lookup`` tasks (``tasks``) that a real ``rollserve serve`` runs: bwrap sandboxes, the
tool agent's multi-turn loop against the policy's inference server in token mode, rollserve's
evaluation as the reward. Two runs start from the same weights: ``synchronous`` (each batch
generated when the trainer asks for it) and ``decoupled`` (the next batch generated while the
trainer updates). The held-out reward (instances disjoint from training, numbers never seen in
training) is measured before training, every few steps and at the end."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from rollserve.bench.serve import start_node, stop_node
from rollserve.client.http import wait_ready
from rollserve.learn.figures import LearnPlan, Mode, RunFigures
from rollserve.learn.plot import plot_runs
from rollserve.learn.tasks import instances
from rollserve.ports import free_port


class CurvePoint(BaseModel):
    """A step of the main run, as the learning curve shows it."""

    step: int
    train_reward: float
    heldout_reward: float | None


class LearnResult(BaseModel):
    """The bench's figures; the top-level curve and held-out rewards are the main run's (the
    first mode run)."""

    main: Mode
    heldout_before: float
    heldout_after: float
    steps: list[CurvePoint]
    wall_s: float
    plot: str
    sync_step_s: float | None
    decoupled_step_s: float | None
    policy: dict[str, object]
    warm_start: dict[str, object]
    train_instances: int
    heldout_instances: int
    plan: LearnPlan
    runs: list[RunFigures]
    total_s: float


def bench_learn(
    plan: LearnPlan,
    out: Path,
    *,
    modes: tuple[Mode, ...] = ("decoupled", "synchronous"),
    heldout: int = 64,
    copy_steps: int = 300,
    warm_steps: int = 300,
) -> LearnResult:
    """Warm-start the policy, then train it once per mode; the figures, a plot and the JSON
    go into ``out``."""
    from rollserve.learn.policy import WarmStart, warm_start
    from rollserve.learn.run import train_run, trainer_threads
    from rollserve.llm.local.tiny_model import build_tiny_model

    began = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="rollserve-learn-"))
    policy = out / "warm-policy"  # kept: a later bench with the same warm start reuses it
    made = {
        "seed": plan.seed,
        "copy_steps": copy_steps,
        "warm_steps": warm_steps,
        "recipe": _recipe(),  # the code that builds the policy: a change rebuilds it
    }
    marker = policy / "warm-start.json"
    kept = json.loads(marker.read_text()) if marker.is_file() else {}
    if kept.get("made") == made:
        warm = WarmStart(**kept["warm"])
    else:
        shutil.rmtree(policy, ignore_errors=True)
        build_tiny_model(policy, seed=plan.seed, learner=True)
        warm = warm_start(policy, copy_steps=copy_steps, steps=warm_steps, seed=plan.seed)
        marker.write_text(json.dumps({"made": made, "warm": warm.__dict__}))
    train = instances("train", plan.steps * plan.prompts, plan.seed)
    held = instances("heldout", heldout, plan.seed)
    port = free_port()
    pools = ["--run-workers=32", "--init-workers=8", "--eval-workers=8"]
    server = start_node(port, base / "data", out / "rollserve-serve.log", *pools)
    url = f"http://127.0.0.1:{port}"
    runs: list[RunFigures] = []
    try:
        if not wait_ready(url, 60):
            raise RuntimeError(f"rollserve serve did not become ready (log: {out})")
        for mode in modes:
            with trainer_threads(mode, plan):
                runs.append(train_run(mode, plan, url, policy, base / mode, train, held))
    finally:
        stop_node(server)
    main = runs[0]
    step_s = {r.mode: r.step_s for r in runs}
    result = LearnResult(
        main=main.mode,
        heldout_before=main.heldout_before,
        heldout_after=main.heldout_after,
        steps=[
            CurvePoint(step=s.step, train_reward=s.train_reward, heldout_reward=s.heldout_reward)
            for s in main.steps
        ],
        wall_s=main.wall_s,
        plot=str(plot_runs(runs, out / "learn.png").resolve()),
        sync_step_s=step_s.get("synchronous"),
        decoupled_step_s=step_s.get("decoupled"),
        policy=_describe(policy),
        warm_start=warm.__dict__,
        train_instances=len(train),
        heldout_instances=len(held),
        plan=plan,
        runs=runs,
        total_s=round(time.monotonic() - began, 2),
    )
    (out / "learn.json").write_text(result.model_dump_json(indent=2))
    shutil.rmtree(base, ignore_errors=True)  # kept when the bench failed: its runs' logs are there
    return result


def _recipe() -> str:
    from rollserve.learn import policy, tasks
    from rollserve.llm.local import tiny_model

    digest = hashlib.sha256()
    for module in (policy, tasks, tiny_model):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()[:16]


def _describe(policy: Path) -> dict[str, object]:
    config = json.loads((policy / "config.json").read_text())
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "tie_word_embeddings")
    return {k: config.get(k) for k in keys}
