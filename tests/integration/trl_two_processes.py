"""Run by ``torchrun --nproc_per_node 2`` from test_train_trl: TRL's GRPOTrainer
in two processes, every completion from rollserve. Each process writes the jobs it got."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rollserve.client import RolloutClient
from rollserve.client.trl import RollserveRollout, rollserve_reward

PROMPTS = ["Say abc.", "Say bcd.", "Say cde.", "Say def."]


def task(row: dict[str, Any]) -> dict[str, Any]:
    number = PROMPTS.index(row["prompt"])
    return {
        "task_id": f"kw-{number}",
        "kind": "keyword",
        "prompt": row["prompt"],
        "keywords": ["a"],
    }


def main(url: str, model_dir: str, out: str) -> None:
    rows = [{"prompt": p} for p in PROMPTS]
    with RolloutClient(url) as client:
        rollout = RollserveRollout(
            client,
            task,
            model="tiny",
            agent={"name": "tool", "max_turns": 1},
            sampling={"max_tokens": 8},
            rows=rows,
            timeout=300,
        )
        config = GRPOConfig(
            output_dir=str(Path(out) / "trl"),
            per_device_train_batch_size=2,
            num_generations=4,  # one group per step, two samples in each process
            max_steps=2,
            beta=0.0,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            disable_tqdm=True,
            seed=0,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*experimental feature.*")
            trainer = GRPOTrainer(
                model=AutoModelForCausalLM.from_pretrained(model_dir),
                processing_class=AutoTokenizer.from_pretrained(model_dir),
                reward_funcs=[rollserve_reward],
                args=config,
                train_dataset=Dataset.from_list(rows),
                rollout_func=rollout,
            )
        trainer.train()
    rank = trainer.accelerator.process_index
    calls = [call.model_dump(mode="json") for call in rollout.calls]
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(calls))


if __name__ == "__main__":
    main(*sys.argv[1:4])
