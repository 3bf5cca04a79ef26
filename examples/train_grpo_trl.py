"""Train a tiny model with TRL's GRPOTrainer on the CPU, every rollout run by rollserve.

The trainer process builds the tiny model, serves its *current* policy with rollserve's local
inference server (the very module TRL trains, under uvicorn in a background thread), registers
that server with rollserve as a ``vllm`` backend in token mode, and trains on ``keyword``
episodes (reward: the share of target characters in the reply) that rollserve runs with the
tool agent. After each optimizer step it re-registers the backend with ``policy_version``
``N`` (the optimizer step). Generation and the optimizer step never overlap: one lock
guards the weights.

    pip install -e '.[llm,train]'
    python examples/train_grpo_trl.py --steps 3            # starts its own `rollserve serve`
    python examples/train_grpo_trl.py --server http://127.0.0.1:8700

The last line printed is a JSON object with the figures (rewards per step, the policy versions
seen in the trajectories, the L2 change of the weights, seconds per step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from rollserve.client import RolloutClient
from rollserve.client.trl import RollserveRollout, rollserve_reward
from rollserve.llm.local.engine import Generation, LocalEngine
from rollserve.llm.local.server import create_llm_app
from rollserve.llm.local.tiny_model import tiny_model_dir
from rollserve.schema.backends import BackendSpec

MODEL = "tiny-policy"
BACKEND = "trainer-policy"
PROMPTS = [
    ("Write a short line with the digits 4 and 2.", ["4", "2", "w", "m"]),
    ("Name a few words with f and b in them.", ["f", "b", "h", "c"]),
    ("Say hello, then count to 12.", ["1", "2", "y", "g"]),
    ("Which files hold the tests?", ["k", "w", "7", "d"]),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GuardedEngine(LocalEngine):
    """A LocalEngine whose generations hold ``weights_lock``, as the optimizer step does."""

    def __init__(self, model: Path, lock: threading.Lock) -> None:
        super().__init__(model, model_name=MODEL)
        self.weights_lock = lock

    def generate(self, prompt_ids: list[int], **kwargs: Any) -> Generation:
        with self.weights_lock:
            return super().generate(prompt_ids, **kwargs)


@contextlib.contextmanager
def policy_server(engine: LocalEngine) -> Iterator[str]:
    """The engine's vLLM-compatible API on a free port, in a background thread."""
    port = free_port()
    config = uvicorn.Config(create_llm_app(engine), host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="policy-server", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the policy server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def rollserve_server(url: str | None, data_dir: Path) -> Iterator[str]:
    """``url``, or a ``rollserve serve`` child process with the test plug-ins."""
    if url is not None:
        yield url
        return
    port = free_port()
    command = [sys.executable, "-m", "rollserve.cli.app", "serve", "--port", str(port)]
    command += ["--data-dir", str(data_dir), "--plugins", "rollserve.testing.plugin"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("rollserve serve did not become ready")
            time.sleep(0.1)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class PolicySync(TrainerCallback):
    """Holds the weights lock over each optimizer step, then re-registers the policy's
    backend with the new version; times each step."""

    def __init__(self, lock: threading.Lock, client: RolloutClient, spec: BackendSpec) -> None:
        self.lock, self.client, self.spec = lock, client, spec
        self.started = 0.0
        self.seconds: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.lock.acquire()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.lock.release()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        version = state.global_step
        self.client.register_backend(self.spec.model_copy(update={"policy_version": version}))
        now = time.monotonic()  # a step: its rollouts, the update and the re-registration
        self.seconds.append(now - self.started)
        self.started = now


def keyword_task(row: dict[str, Any]) -> dict[str, Any]:
    number = [p for p, _ in PROMPTS].index(row["prompt"])
    return {"task_id": f"kw-{number}", "kind": "keyword", "prompt": row["prompt"], **row}


def train(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    lock = threading.Lock()
    model_dir = tiny_model_dir(work / "models", seed=args.seed)
    engine = GuardedEngine(model_dir, lock)
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    with (
        rollserve_server(args.server, work / "rollserve") as url,
        policy_server(engine) as policy_url,
        RolloutClient(url) as client,
    ):
        spec = BackendSpec(
            id=BACKEND,
            kind="vllm",
            url=policy_url,
            model=MODEL,
            tokenizer=str(model_dir),
            policy_version=0,
        )
        client.register_backend(spec)
        rows = [{"prompt": p, "keywords": k} for p, k in PROMPTS]
        rollout = RollserveRollout(
            client,
            keyword_task,
            model=MODEL,
            agent={"name": "tool", "max_turns": 2, "end_without_tool_call": True},
            sampling={"max_tokens": args.max_tokens, "temperature": 1.0},
            rows=rows,
            timeout=300,
        )
        sync = PolicySync(lock, client, spec)
        config = GRPOConfig(
            output_dir=str(work / "trl"),
            per_device_train_batch_size=args.prompts * args.generations,
            num_generations=args.generations,
            max_steps=args.steps,
            learning_rate=args.lr,
            beta=0.0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            disable_tqdm=True,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*experimental feature.*")
            trainer = GRPOTrainer(
                model=engine.model,
                processing_class=engine.tokenizer,
                reward_funcs=[rollserve_reward],
                args=config,
                train_dataset=Dataset.from_list(rows),
                rollout_func=rollout,
                callbacks=[sync],
            )
        if trainer.model is not engine.model:
            raise RuntimeError("TRL trains a copy: the served policy would not follow it")
        trainer.train()
        backend = next(b for b in client.backends() if b.id == BACKEND)
        jobs = client.status().jobs
        if not args.keep_backend:  # its server goes away with this process
            client.remove_backend(BACKEND)
    change = math.sqrt(
        sum(
            float(((p.detach() - before[n]) ** 2).sum()) for n, p in engine.model.named_parameters()
        )
    )
    return {
        "steps": args.steps,
        "rewards": [call.rewards for call in rollout.calls],
        "mean_reward": [sum(c.rewards) / len(c.rewards) for c in rollout.calls],
        "policy_versions": [
            sorted({v for turns in c.policy_versions for v in turns if v is not None})
            for c in rollout.calls
        ],
        "turns": [c.turns for c in rollout.calls],
        "job_ids": [job for c in rollout.calls for job in c.job_ids],
        "backend_policy_version": backend.policy_version,
        "weight_l2_change": change,
        "seconds_per_step": sync.seconds,
        "rollout_seconds": [c.seconds for c in rollout.calls],
        "server_jobs": jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--server", help="rollserve URL (default: start one)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per model turn")
    parser.add_argument("--lr", type=float, default=5e-3, help="learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep-backend", action="store_true", help="leave the policy's backend registered"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollserve-train-") as work:
        figures = train(args, Path(work))
    for step, (rewards, versions, seconds) in enumerate(
        zip(
            figures["rewards"],
            figures["policy_versions"],
            figures["seconds_per_step"],
            strict=False,
        ),
        start=1,
    ):
        shown = " ".join(f"{r:.2f}" for r in rewards)
        print(
            f"step {step}: rewards [{shown}] policy {','.join(map(str, versions))} {seconds:.1f}s"
        )
    print(f"backend policy version: {figures['backend_policy_version']}")
    print(f"weight L2 change: {figures['weight_l2_change']:.4f}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
