"""veRL trains through rollserve: veRL 0.9.1 (its own virtual environment: it pins
transformers < 5.11) runs its real AgentLoopWorker, from its own ppo_trainer config, over
``RollserveAgentLoop`` registered by an agent-loop config file; the loop's jobs run on a real
``rollserve serve`` against the tiny model, and the batch veRL builds holds their exact tokens,
rewards and versions. The environment is made once and kept in ``.venv-verl``."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ROOT, Server
from tests.servers import LlmServer
from tests.venvs import made_venv

VERL_VENV = ROOT / ".venv-verl"
REQUIREMENTS = ["verl==0.9.1", "torch==2.13.0", "cachetools", "fastapi", "uvicorn", "httpx"]


@pytest.fixture(scope="session")
def verl_python() -> Path:
    """veRL's interpreter, with rollserve's client installed from this checkout."""
    python = made_venv(VERL_VENV, REQUIREMENTS)
    # The client from this checkout, without its dependencies' versions changing veRL's.
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(ROOT)],
        check=True,
        timeout=600,
    )
    return python


def test_verl_agent_loop_through_rollserve(
    verl_python: Path,
    server_factory: Callable[..., Server],
    tiny_model: Path,
    llm_server_factory: Callable[[Path, str], LlmServer],
    tmp_path: Path,
) -> None:
    server = server_factory()
    server.start()
    llm = llm_server_factory(tiny_model, "tiny")
    address = llm.root.removeprefix("http://")
    script = ROOT / "tests" / "integration" / "verl_agent_loop.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [str(verl_python), str(script), server.url, address, str(tiny_model), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])

    assert summary["registered_by_name"]
    assert summary["published"] == [["verl-0", f"{llm.url}", 3]]
    shapes = summary["shapes"]
    assert shapes["prompts"] == [4, 1024] and shapes["responses"] == [4, 40]
    assert shapes["rm_scores"] == [4, 40] and shapes["rollout_log_probs"] == [4, 40]
    # veRL's uid is the group; each sample its own job, named by group and slot.
    assert summary["uids"] == ["u0", "u0", "u1", "u1"]
    assert sorted(summary["job_ids"]) == ["verl-u0-0", "verl-u0-1", "verl-u1-0", "verl-u1-1"]
    assert [job_id.rsplit("-", 1)[0] for job_id in summary["job_ids"]] == [
        "verl-u0",
        "verl-u0",
        "verl-u1",
        "verl-u1",
    ]
    assert summary["min_global_steps"] == summary["max_global_steps"] == [3, 3, 3, 3]

    page = httpx.get(f"{server.url}/v1/results", params={"limit": 100}).json()
    jobs = {view["job_id"]: view for view in page["results"]}
    for index, job_id in enumerate(summary["job_ids"]):
        view = jobs[job_id]
        assert view["status"] == "completed" and view["group_id"] == summary["uids"][index]
        tokens = view["result"]["tokens"]
        # The batch holds the job's exact response, cut to veRL's response length.
        assert summary["responses"][index] == tokens["response_ids"][:40]
        assert (
            summary["masks"][index][: len(summary["responses"][index])]
            == tokens["response_mask"][:40]
        )
        assert summary["rewards"][index] == pytest.approx(view["result"]["reward"])
    kinds = {jobs[j]["result"]["evaluation"].get("of") for j in summary["job_ids"][:2]}
    assert kinds == {2}  # u0 ran the keyword task from extra_info.rollserve_task
