"""A real ``rollserve serve`` process on a free port, with the test plug-ins."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.client import wait_ready
from rollserve.sandbox.state import reap
from rollserve.settings import Settings
from rollserve.testing.scripted import ScriptedLLMServer
from tests.servers import LlmServer, free_port

ROOT = Path(__file__).parents[2]


class Server:
    """``rollserve serve`` on ``data_dir``, run after ``prefix`` (e.g. entering a mount
    namespace); ``view`` is where this process finds the data directory (default: there)."""

    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str],
        prefix: list[str] | None = None,
        view: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.view = view or data_dir
        self.prefix = prefix or []
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.data_dir.parent / "server.log", "ab") as log:  # the child keeps it
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    sys.executable,
                    "-m",
                    "rollserve.cli.app",
                    "serve",
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    "--plugins",
                    "rollserve.testing.plugin",
                ],
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        assert wait_ready(self.url, 30), "the server did not become ready"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
                # What the server's next start would do: its sandboxes' processes, mounts
                # and folders go (a data directory of a test is never started again).
                reap(Settings(data_dir=self.view).state_dir)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(**env: str) -> Server:
        server = Server(tmp_path / "data", {f"ROLLSERVE_{k.upper()}": v for k, v in env.items()})
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def llm_server_factory(tmp_path: Path) -> Iterator[Callable[[Path, str], LlmServer]]:
    servers: list[LlmServer] = []

    def make(model_dir: Path, name: str) -> LlmServer:
        server = LlmServer(model_dir, name, tmp_path / f"llm-{len(servers)}.log")
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()


def register_backend(server: Server, **spec: Any) -> dict[str, Any]:
    """Register an inference backend with the server; the view it answered."""
    answer = httpx.post(f"{server.url}/v1/llm/backends", json=spec, timeout=60)
    assert answer.status_code == 201, answer.text
    view: dict[str, Any] = answer.json()
    return view


def scripted_job(server: Server, turns: list[dict[str, Any]], task: Any, wait: float) -> Any:
    """One job of ``task`` (a Task) through ``server``, its model the scripted LLM server
    answering ``turns`` with native tool calls; the job's view once it has ended."""
    with (
        ScriptedLLMServer(turns, native_tool_calls=True) as llm,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        spec = {"id": "s", "kind": "openai", "url": llm.url, "model": "scripted"}
        assert http.post("/v1/llm/backends", json=spec).status_code == 201
        request = {"task": task.model_dump(mode="json"), "model": "scripted"}
        job_id = http.post("/v1/jobs", json=request).json()["job_id"]
        return http.get(f"/v1/jobs/{job_id}", params={"wait": wait}).json()


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """A scripted model turn that calls tool ``name``."""
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}
