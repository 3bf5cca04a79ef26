"""Run by test_train_trl: TRL's experimental AsyncGRPOTrainer on the CPU, its samples from
rollserve through ``RollserveRolloutWorker``. Two stand-ins make the trainer run without a GPU,
neither of them part of what is tested: its tree attention calls a CUDA-only flash-attention
kernel (replaced by a per-segment scaled_dot_product_attention), and it asks CUDA for the peak
FLOPs (answered None). Weights are not sent to the inference server (a no-op transfer): the
test is about the samples' path, not the policy's. Prints a JSON summary."""

from __future__ import annotations

import json
import os
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
import trl.experimental.async_grpo.packing as packing
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from rollserve.client.trl_async import RollserveRolloutWorker

PROMPTS = ["Say abc.", "Say bcd.", "Say cde."]


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    **_: Any,
) -> torch.Tensor:
    """flash_attn_varlen_func's contract on the CPU: each segment attends causally, the
    queries aligned to the end of its keys; grouped key/value heads are repeated."""
    out = torch.empty_like(q)
    repeat = q.shape[1] // k.shape[1]
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        queries = q[q0:q1].transpose(0, 1)
        keys = k[k0:k1].transpose(0, 1).repeat_interleave(repeat, 0)
        values = v[k0:k1].transpose(0, 1).repeat_interleave(repeat, 0)
        rows = torch.arange(q1 - q0)[:, None]
        cols = torch.arange(k1 - k0)[None, :]
        mask = cols <= rows + ((k1 - k0) - (q1 - q0))
        attended = torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, scale=softmax_scale
        )
        out[q0:q1] = attended.transpose(0, 1)
    return out


class NoTransfer:
    """Weight transfer that sends nothing (it still drains the iterator, as required)."""

    def init_weight_transfer(self) -> None: ...

    def pause(self) -> None: ...

    def send_weights(self, iterator: Any) -> None:
        for _ in iterator:
            pass

    def resume(self) -> None: ...

    def destroy(self) -> None: ...


def task(row: dict[str, Any]) -> dict[str, Any]:
    number = PROMPTS.index(row["prompt"])
    return {
        "task_id": f"kw-{number}",
        "kind": "keyword",
        "prompt": row["prompt"],
        "keywords": list(
            "abcdefghijklmnopqrstuvwxyz"
        ),  # graded rewards: advantages rarely all zero
    }


def main(url: str, model_dir: str, out: str) -> None:
    packing._flash_attn = lambda: types.SimpleNamespace(flash_attn_varlen_func=varlen_attention)
    trainer_module.get_peak_flops_per_device = lambda *args: None
    rows = [{"prompt": p} for p in PROMPTS]
    worker = RollserveRolloutWorker(
        url,
        task,
        rows,
        model="tiny",
        group_size=3,
        agent={"name": "tool", "max_turns": 1},
        sampling={"max_tokens": 8, "temperature": 1.0},
        groups_in_flight=2,
    )
    args = AsyncGRPOConfig(
        output_dir=str(Path(out) / "trl"),
        per_device_train_batch_size=3,
        num_generations=3,
        max_steps=3,
        token_budget=0,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = AsyncGRPOTrainer(
            model=model_dir,
            args=args,
            train_dataset=Dataset.from_list(rows),
            rollout_worker=worker,
            weight_transfer=NoTransfer(),
        )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    summary = {
        "model_version": trainer.model_version,
        "worker_version": worker.model_version,
        "groups_done": worker.groups_done,
        "changed": changed,
        "parameters": len(before),
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "run_id": worker.run_id,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main(*sys.argv[1:4])
