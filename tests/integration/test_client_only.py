"""A trainer node installs the client alone: a fresh virtual environment gets ``pip install
rollserve`` (no extras) from this source tree, holds only httpx, pydantic and their own
dependencies, and drives a real ``rollserve serve`` with the client: a job, the results feed,
a pause and resume of a model."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import Server

ROOT = Path(__file__).parents[2]

_DRIVE = textwrap.dedent(
    """
    import importlib.util, sys
    from rollserve.client import RolloutClient

    server_side = ["fastapi", "uvicorn", "transformers", "typer", "math_verify", "torch"]
    present = [name for name in server_side if importlib.util.find_spec(name) is not None]
    assert not present, present
    with RolloutClient(sys.argv[1]) as client:
        task = {"task_id": "six-sevens", "kind": "math", "prompt": "6*7?", "answer": "42"}
        agent = {"name": "submit", "submission": "42"}
        client.submit({"job_id": "c1", "task": task, "agent": agent})
        done = client.wait("c1", timeout=60)
        assert done.status == "completed" and done.result.reward == 1.0, done
        page = client.results()
        assert [view.job_id for view in page.results] == ["c1"]
        state = client.pause_model("m", "abort", admission=True)
        assert state.paused and state.mode == "abort" and state.admission_paused
        state = client.resume_model("m", policy_version=3)
        assert not state.paused
    print("client-only ok")
    """
)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with rollserve installed without extras."""
    base = tmp_path_factory.mktemp("client-only")
    source = base / "source"  # a copy, so that the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    subprocess.run(
        [*pip, str(source)],
        check=True,
        timeout=600,
    )
    return venv


def test_the_client_alone_drives_a_server(
    client_venv: Path, server_factory: Callable[..., Server]
) -> None:
    listed = subprocess.run(
        [str(client_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    allowed = {"rollserve", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio"}
    allowed |= {
        "pydantic",
        "pydantic-core",
        "pydantic_core",
        "annotated-types",
        "typing-extensions",
    }
    allowed |= {"typing_extensions", "typing-inspection", "pip", "setuptools", "exceptiongroup"}
    assert names <= allowed, names - allowed
    command = subprocess.run(
        [str(client_venv / "bin" / "rollserve"), "serve"], capture_output=True, text=True
    )
    assert command.returncode != 0 and "pip install 'rollserve[server]'" in command.stderr

    server = server_factory()
    server.start()
    drive = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", _DRIVE, server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert drive.returncode == 0, drive.stderr
    assert "client-only ok" in drive.stdout
