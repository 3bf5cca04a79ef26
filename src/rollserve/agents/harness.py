"""The ``harness`` agent: a Python agent harness (``rollserve.harness``) run beside the job's
sandbox, as a process of the harness's own interpreter and virtual environment. It drives the
sandbox (the job's PTY shell, its files) and its model through the job's gateway, reached
over the node's gateway socket. A harness is the user's own code, trusted as a plug-in is:
it runs on the host as rollserve's user; the commands it sends run in the sandbox.

The submission is what the harness submitted, else the workspace's diff where it changed the
workspace, else its last reply's text."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.agents.base import RunContext, agent_fields
from rollserve.agents.gateway_run import GatewayRun, default_submission
from rollserve.errors import InvalidInputError
from rollserve.gateway.sandbox import JobSandbox
from rollserve.llm.toolcalls import ToolCallParser
from rollserve.registry import Registry
from rollserve.sandbox.base import Sandbox
from rollserve.sandbox.output import HeadTail
from rollserve.schema.jobs import AgentConfig
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import ExecResult

_OUTPUT_BYTES = 1024 * 1024  # of the harness's stdout and stderr, head and tail


class HarnessSettings(BaseModel):
    """The harness agent's own fields of ``agent``."""

    model_config = ConfigDict(extra="forbid")

    harness: str = Field(
        min_length=1, description="its name (built in, an entry point) or module:attribute"
    )
    python: Path = Field(
        default_factory=lambda: Path(sys.executable),
        description="the interpreter of the harness's environment (rollserve's client in it)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="the harness's own")
    env: dict[str, str] = Field(default_factory=dict, description="added to its environment")
    parser: str | None = Field(
        None, description="tool-call format of the model; default: the chat template's"
    )

    @field_validator("python")
    @classmethod
    def _python(cls, value: Path) -> Path:
        if not value.is_absolute() or not os.access(value, os.X_OK):
            raise ValueError(f"{value} is not an executable interpreter (an absolute path)")
        return value


class HarnessAgent:
    """Agent ``harness``: ``{"name": "harness", "harness": "mini-swe-agent", "python": …}``."""

    name = "harness"

    def __init__(self, parsers: Registry[ToolCallParser]) -> None:
        self.parsers = parsers

    def settings(self, config: AgentConfig) -> HarnessSettings:
        own = agent_fields(HarnessSettings, config)
        if own.parser is not None:
            self.parsers.get(own.parser)
        return own

    def validate(self, config: AgentConfig) -> None:
        self.settings(config)

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput:
        own = self.settings(config)
        if sandbox is None:
            raise InvalidInputError(
                "agent 'harness' drives the task's sandbox, and this task has none", field="agent"
            )
        assert context.settings is not None
        shell = JobSandbox(sandbox, config.command_timeout_s)
        try:
            async with GatewayRun.open(context, self.parsers, own.parser) as run:
                run.job.attach(shell)
                env = {
                    **os.environ,
                    "ROLLSERVE_GATEWAY_SOCKET": str(context.settings.gateway_socket_path),
                    "ROLLSERVE_GATEWAY_KEY": run.key,
                    "ROLLSERVE_HARNESS_OPTIONS": json.dumps(own.options),
                    "PYTHONUNBUFFERED": "1",
                    **own.env,
                }
                began = time.monotonic()
                process = asyncio.create_task(
                    _run([str(own.python), "-m", "rollserve.harness", own.harness], env)
                )
                try:
                    ended_by = await run.wait(process)
                except asyncio.CancelledError:
                    context.agent_run = run.agent_run(None, time.monotonic() - began, "timeout")
                    raise
                result = process.result() if not process.cancelled() else None
                context.agent_run = run.agent_run(result, time.monotonic() - began, ended_by)
                run.sync()
                submitted = run.job.submitted
                context.submission = (
                    submitted
                    if submitted is not None
                    else await default_submission(sandbox, context)
                )
                return context.output(run.exit_reason(result.exit_code if result else None))
        finally:
            await shell.close()


async def _run(argv: list[str], env: dict[str, str]) -> ExecResult:
    """The harness process to its end; cancelled, its whole process group is killed."""
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    out, err = HeadTail(_OUTPUT_BYTES), HeadTail(_OUTPUT_BYTES)

    async def pump(stream: asyncio.StreamReader | None, sink: HeadTail) -> None:
        assert stream is not None
        while chunk := await stream.read(65536):
            sink.feed(chunk)

    try:
        await asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err), proc.wait())
    finally:
        # whatever the harness left running in its group ends with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            await proc.wait()
    code = proc.returncode
    assert code is not None
    return ExecResult(
        exit_code=128 - code if code < 0 else code,
        stdout=out.text(),
        stderr=err.text(),
        duration_s=time.monotonic() - began,
        truncated=out.truncated or err.truncated,
    )
