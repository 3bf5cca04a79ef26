"""A real ``rollserve serve`` process on a free port, with the test plug-ins."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.data_dir.parent / "server.log", "ab") as log:  # the child keeps it
            self.proc = subprocess.Popen(
                [
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
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the server did not become ready")

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
def models_url() -> Iterator[str]:
    """A minimal OpenAI-style server that answers ``GET /v1/models`` (registration's check)."""

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/v1/models"
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode() if ok else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


class LlmServer:
    """``rollserve llm serve`` on a free port, as a real process (the CPU inference server)."""

    def __init__(self, model_dir: Path, name: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        with open(log, "ab") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rollserve.cli.app",
                    "llm",
                    "serve",
                    "--model",
                    str(model_dir),
                    "--port",
                    str(self.port),
                    "--served-model-name",
                    name,
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )
        end = time.monotonic() + 120
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"llm serve exited; see {log}"
            try:
                if httpx.get(f"{self.url}/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("llm serve did not become ready")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and its tokenizer, built once per test session."""
    from rollserve.testing.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


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
