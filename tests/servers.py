"""Real server processes for tests: ``rollserve llm serve`` on a free port."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rollserve.ports import free_port

__all__ = ["LlmServer", "free_port"]

ROOT = Path(__file__).parents[1]


class LlmServer:
    """``rollserve llm serve`` (the CPU inference server) as a real process, serving
    ``model_dir`` under the name ``model``."""

    def __init__(self, model_dir: Path, model: str, log: Path) -> None:
        self.model = model
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root}/v1"
        command = [sys.executable, "-m", "rollserve.cli.app", "llm", "serve"]
        command += ["--model", str(model_dir), "--port", str(self.port)]
        command += ["--served-model-name", model]
        with log.open("ab") as sink:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink
            )
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the LLM server exited:\n{log.read_text()}")
            try:
                if httpx.get(f"{self.url}/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the LLM server did not answer:\n{log.read_text()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL, as a crashed backend."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
