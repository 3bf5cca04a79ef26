"""mini-swe-agent (2.4.6 from PyPI, in its own virtual environment), unchanged, as a harness
beside the sandbox of a real SWE-bench row in its own image: its DefaultAgent and
LitellmModel against the job's gateway (the scripted model server in token mode behind it),
its commands in the job's shell. It fixes the row and scores 1; its twin that submits without
fixing scores 0."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.agents_env import agents_dir
from tests.integration.conftest import Server, register_backend
from tests.swebench.conftest import Instance

MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _bash(command: str) -> dict[str, Any]:
    return {
        "content": "THOUGHT: next step.",
        "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
    }


@pytest.fixture(scope="module")
def agents() -> Path:
    return agents_dir()


@pytest.fixture
def long_tokenizer(tiny_model: Path, tmp_path: Path) -> Path:
    """The tiny model's tokenizer with room for mini-swe-agent's long prompts (its own 2,048
    tokens hold less than mini-swe-agent's instructions in this small vocabulary)."""
    copy = tmp_path / "tokenizer"
    copy.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(tiny_model / name, copy / name)
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    config["model_max_length"] = 65536
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    return copy


def _run(server: Server, instance: Instance, agents: Path, job_id: str) -> dict[str, Any]:
    task = instance.task()
    request = {
        "job_id": job_id,
        "task": task.model_dump(mode="json"),
        "model": "policy",
        "agent": {
            "name": "harness",
            "harness": "mini-swe-agent",
            "python": str(agents / "venv" / "bin" / "python"),
            "options": {"step_limit": 10},
        },
    }
    with httpx.Client(base_url=server.url, timeout=60) as http:
        answer = http.post("/v1/jobs", json=request)
        assert answer.status_code == 202, answer.text
        view = http.get(f"/v1/jobs/{job_id}", params={"wait": 600}, timeout=610).json()
    assert view["status"] == "completed", view
    result: dict[str, Any] = view["result"]
    return result


@pytest.mark.slow
def test_mini_swe_agent_fixes_the_row_and_its_twin_does_not(
    server_factory: Callable[..., Server],
    instance: Instance,
    agents: Path,
    long_tokenizer: Path,
) -> None:
    gold = instance.task().metadata["gold_patch"]
    encoded = base64.b64encode(gold.encode()).decode()
    fix = [
        _bash(
            f"echo {encoded} | base64 -d > /tmp/fix.patch && git apply /tmp/fix.patch "
            "&& git status --short"
        ),
        _bash(f"echo {MARKER} && git diff --stat"),
    ]
    no_fix = [_bash(f"echo {MARKER}")]
    server = server_factory(image_cache_dir=str(instance.cache))
    server.start()
    with ScriptedLLMServer(
        [{"content": "ok"}, *fix, *no_fix], model="policy", tokenizer=long_tokenizer
    ) as llm:
        register_backend(
            server, kind="vllm", url=llm.url, model="policy", tokenizer=str(long_tokenizer)
        )
        fixed = _run(server, instance, agents, "mini-fix")
        unfixed = _run(server, instance, agents, "mini-no-fix")

    assert fixed["exit_reason"] == "submitted", fixed["agent_run"]["stderr_tail"]
    assert fixed["agent_run"]["exit_code"] == 0
    assert "mini-swe-agent: Submitted" in fixed["agent_run"]["stdout_tail"]
    assert fixed["evaluation"]["resolution"] == "RESOLVED_FULL", fixed["evaluation"]
    assert fixed["reward"] == 1.0 and "def get_annotation" in fixed["patch"]
    # The commands ran in the job's shell, at the repository's root inside the image.
    tools = [m for m in fixed["messages"] if m["role"] == "tool"]
    assert "M pylint/pyreverse/utils.py" in tools[0]["content"]
    tokens = fixed["tokens"]
    assert fixed["segments"] == [] and len(tokens["turns"]) == 2
    assert sum(tokens["response_mask"]) == sum(t["generated_tokens"] for t in tokens["turns"])

    assert unfixed["exit_reason"] == "submitted" and unfixed["reward"] == 0.0
    assert len(unfixed["turn_log"]) == 1
