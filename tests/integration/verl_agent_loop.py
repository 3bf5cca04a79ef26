"""Run with the veRL virtual environment by test_verl: veRL's own AgentLoopWorker (built from
veRL's ppo_trainer config, on the CPU, without Ray) generates a batch through
``RollserveAgentLoop``, registered by an agent-loop config file; the trainer-side
``VerlServers`` registers the rollout server first. Prints a JSON summary of the batch."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry
from verl.protocol import DataProto

import rollserve.client.verl  # noqa: F401  (registers "rollserve" by name)
from rollserve.client import RolloutClient
from rollserve.client.verl import VerlServers

PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 40


def config(model_dir: str, loops: Path) -> object:
    root = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=root, version_base=None):
        made = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=rollserve-test",
            ],
        )
    OmegaConf.resolve(made)
    return made


async def generate(cfg: object) -> DataProto:
    worker = AgentLoopWorker(cfg, llm_client=object())  # the loop never uses veRL's client
    keyword = {"task_id": "kw", "kind": "keyword", "prompt": "Say abc.", "keywords": ["a", "b"]}
    rows = [
        ("u0", [{"role": "user", "content": "Say abc."}], {"rollserve_task": keyword}, {}),
        ("u1", [{"role": "user", "content": "What is 6*7?"}], {}, {"ground_truth": "42"}),
    ]
    samples = [row for row in rows for _ in range(2)]  # two samples a prompt, as rollout.n=2
    raw = np.empty(len(samples), dtype=object)
    raw[:] = [messages for _, messages, _, _ in samples]
    batch = DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros(len(samples), 1, dtype=torch.uint8)},
        non_tensors={
            "raw_prompt": raw,
            "uid": np.array([uid for uid, *_ in samples], dtype=object),
            "index": np.array([i // 2 for i in range(len(samples))]),
            "extra_info": np.array([extra for _, _, extra, _ in samples], dtype=object),
            "reward_model": np.array([reward for *_, reward in samples], dtype=object),
            "data_source": np.array(["test"] * len(samples), dtype=object),
        },
        meta_info={"global_steps": 3, "validate": False},
    )
    return await worker.generate_sequences(batch)


def main(url: str, llm_address: str, model_dir: str, work: str) -> None:
    with RolloutClient(url) as client:
        servers = VerlServers(client, model="tiny", tokenizer=model_dir)
        published = servers.publish([llm_address], step=3)
    loops = Path(work) / "agent_loops.yaml"
    loops.write_text(
        "- name: rollserve-test\n"
        "  _target_: rollserve.client.verl.RollserveAgentLoop\n"
        f"  rollserve_url: {url}\n"
        "  model: tiny\n"
        "  agent: {name: tool, max_turns: 2, end_without_tool_call: false}\n"
    )
    out = asyncio.run(generate(config(model_dir, loops)))
    mask = out.batch["response_mask"]
    summary = {
        "registered_by_name": "rollserve" in _agent_loop_registry,
        "published": [(v.id, v.url, v.policy_version) for v in published],
        "shapes": {key: list(value.shape) for key, value in out.batch.items()},
        "uids": out.non_tensor_batch["uid"].tolist(),
        "job_ids": out.non_tensor_batch["rollserve_job_id"].tolist(),
        "min_global_steps": out.non_tensor_batch["min_global_steps"].tolist(),
        "max_global_steps": out.non_tensor_batch["max_global_steps"].tolist(),
        "responses": [
            out.batch["responses"][i][
                : int(out.batch["attention_mask"][i][PROMPT_LENGTH:].sum())
            ].tolist()
            for i in range(len(mask))
        ],
        "masks": mask.tolist(),
        "rewards": out.batch["rm_scores"].sum(dim=1).tolist(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main(*sys.argv[1:5])
