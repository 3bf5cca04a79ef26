"""The child processes of ``rollserve demo``: the model server (``rollserve llm serve``) and
the model-side preparation (``rollserve.demo.prepare``). Each child runs in its own session
(a Ctrl-C reaches the demo only, which then stops it), is killed by the kernel should the demo
die first (``setpriv --pdeathsig``, where util-linux has it), and is reaped on every path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from rollserve.demo.checks import ModelSource
from rollserve.errors import InfrastructureError
from rollserve.ports import free_port

_STOP_GRACE_S = 10.0


def _argv(module: str, *args: str) -> list[str]:
    command = [sys.executable, "-m", module, *args]
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command


def _tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the child's process group, SIGKILL after a grace period; always reaped."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(_STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def run_prepare(log: Path, *args: str) -> dict[str, Any]:
    """Run ``rollserve.demo.prepare ARGS`` to completion; its JSON answer."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        process = await asyncio.create_subprocess_exec(
            *_argv("rollserve.demo.prepare", *args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=sink,
            start_new_session=True,
        )
    try:
        out, _ = await process.communicate()
    finally:
        await _stop(process)
    if process.returncode != 0:
        raise InfrastructureError(
            f"preparing the model failed (exit {process.returncode}); {log}:\n{_tail(log)}"
        )
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


class ModelServer:
    """``rollserve llm serve`` for one model, as a child process on a free port."""

    def __init__(self, source: ModelSource, log: Path) -> None:
        self.source = source
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: asyncio.subprocess.Process | None = None
        self.started = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> None:
        args = ["llm", "serve", "--model", str(self.source.directory), "--port", str(self.port)]
        args += ["--served-model-name", self.source.name]
        if self.source.gguf_file:
            args += ["--gguf-file", self.source.gguf_file]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        with self.log.open("ab") as sink:  # the child keeps its own copy of the descriptor
            self.process = await asyncio.create_subprocess_exec(
                *_argv("rollserve.cli.app", *args),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        """InfrastructureError, with the end of its log, when the server has exited."""
        assert self.process is not None
        if self.process.returncode is not None:
            raise InfrastructureError(
                f"the model server exited with code {self.process.returncode}; "
                f"{self.log}:\n{_tail(self.log)}"
            )

    async def wait_ready(self, timeout_s: float) -> int:
        """Wait until ``/v1/models`` serves the model; its context length."""
        end = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    answer = await http.get(f"{self.url}/models")
                    if answer.status_code == 200:
                        card = answer.json()["data"][0]
                        return int(card.get("max_model_len") or 2048)
                if time.monotonic() > end:
                    raise InfrastructureError(
                        f"the model server did not answer within {timeout_s:g} s; "
                        f"{self.log}:\n{_tail(self.log)}"
                    )
                await asyncio.sleep(0.25)

    async def stop(self) -> None:
        if self.process is not None:
            await _stop(self.process)
