"""The tiny model, built once per session, and a real ``rollserve llm serve`` process over it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rollserve.llm.engine import LocalEngine
from rollserve.testing.tiny_model import tiny_model_dir

ROOT = Path(__file__).parents[2]


@dataclass
class LocalLLMServer:
    url: str  # without /v1
    model: str
    process: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp() / "models")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model: Path) -> LocalEngine:
    """The same model in this process, to recompute what the server answered."""
    return LocalEngine(tiny_model)


@pytest.fixture(scope="session")
def local_llm_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalLLMServer]:
    port = _free_port()
    log = tmp_path_factory.mktemp("llm-server") / "server.log"
    command = [sys.executable, "-m", "rollserve.cli.app", "llm", "serve"]
    command += ["--model", str(tiny_model), "--port", str(port)]
    with log.open("ab") as sink:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink)
    server = LocalLLMServer(f"http://127.0.0.1:{port}", tiny_model.name, proc)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the LLM server exited:\n{log.read_text()}")
            try:
                if httpx.get(f"{server.url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the LLM server did not answer:\n{log.read_text()}")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
