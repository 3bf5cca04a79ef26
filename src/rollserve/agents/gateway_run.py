"""An agent process's episode through the gateway, shared by the agents that start one (the
external agent in the sandbox, a harness beside it): the job's gateway key while the run
stage holds the job, its end when a limit or a failure ends the episode, and the turns it
recorded, copied into the run's context whatever way the episode ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rollserve.agents.base import RunContext
from rollserve.errors import InvalidInputError
from rollserve.gateway.job import GatewayJob
from rollserve.gateway.keys import Gateway
from rollserve.llm.parsers import parser_for_template
from rollserve.llm.toolcalls import ToolCallParser
from rollserve.registry import Registry
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, AgentRun, ExitReason
from rollserve.schema.sandbox import ExecResult

_TAIL = 4000  # characters of the agent's stdout and stderr kept in the result


class GatewayRun:
    """One open gateway key and the job behind it."""

    def __init__(self, context: RunContext, job: GatewayJob, key: str) -> None:
        self.context = context
        self.job = job
        self.key = key

    @classmethod
    @asynccontextmanager
    async def open(
        cls, context: RunContext, parsers: Registry[ToolCallParser], parser: str | None
    ) -> AsyncIterator[GatewayRun]:
        llm = context.llm
        if llm is None:
            raise InvalidInputError(
                "an agent served through the gateway needs a model: register a backend first"
            )
        gateway = context.gateway if context.gateway is not None else Gateway()
        await llm.open()
        chosen = None
        if llm.token_mode:
            assert llm.template is not None
            chosen = parsers.get(parser or parser_for_template(llm.template.source))

        async def told(turn: int, messages: list[dict[str, Any]], log: Any) -> None:
            context.turns = turn
            await context.told(turn, messages, log)

        request = context.request
        job = GatewayJob(
            context.job_id,
            request.model,
            llm,
            chosen,
            request.agent or AgentConfig(),
            request.sampling,
            on_turn=told,
            task=request.task.model_dump(mode="json"),
        )
        key = gateway.open(job)
        run = cls(context, job, key)
        why = "its run stage ended"
        try:
            yield run
        except asyncio.CancelledError:
            why = "its run stage was stopped"
            raise
        finally:
            gateway.close(key, why)
            run.sync()

    def sync(self) -> None:
        """The episode's record, from the gateway into the run's context."""
        job, context = self.job, self.context
        context.messages = job.messages
        context.turn_log = job.turn_log
        context.turns = len(job.turn_log)
        context.segments = [s.tokens for s in job.segments if s.tokens is not None]
        context.tokens = job.last.tokens if job.last is not None else None

    async def wait(self, process: asyncio.Task[Any]) -> str | None:
        """Until the agent's process ends, or the gateway ends the episode first (a limit, a
        failure of rollserve's machinery: the process is then killed); what ended it, when
        it did not end on its own."""
        changed = asyncio.create_task(self.job.changed.wait())
        try:
            await asyncio.wait({process, changed}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await _stop(process)
            raise
        finally:
            changed.cancel()
        if process.done():
            return None
        await _stop(process)
        if self.job.failure is not None:
            return "failure"
        return str(self.job.ended)

    def agent_run(self, result: ExecResult | None, wall_s: float, ended_by: str | None) -> AgentRun:
        """What the result keeps of the agent's process (``result`` None: it was killed)."""
        code = result.exit_code if result is not None else None
        return AgentRun(
            exit_code=code,
            signal=code - 128 if code is not None and code > 128 else None,
            wall_s=round(wall_s, 6),
            stdout_tail=result.stdout[-_TAIL:] if result is not None else "",
            stderr_tail=result.stderr[-_TAIL:] if result is not None else "",
            output_truncated=result.truncated if result is not None else False,
            ended_by=ended_by,
            model_calls=self.job.calls,
            refused_calls=self.job.refused,
        )

    def exit_reason(self, exit_code: int | None) -> ExitReason:
        """How the episode ended; rollserve's own failure raises (a retry, or stale)."""
        job = self.job
        if job.failure is not None:
            raise job.failure
        if job.ended is not None:
            return job.ended
        if exit_code != 0:
            return ExitReason.AGENT_ERROR
        if job.calls == 0:
            return ExitReason.NO_MODEL_CALL
        return ExitReason.SUBMITTED


async def _stop(process: asyncio.Task[Any]) -> None:
    """Cancel the process's task (the sandbox kills the process) and wait for it."""
    process.cancel()
    await asyncio.gather(process, return_exceptions=True)


async def default_submission(sandbox: Sandbox, context: RunContext) -> str | None:
    """The submission when the agent named none: the workspace's diff where it changed the
    workspace, else its last reply's text."""
    diff = await sandbox.diff()
    if diff.strip():
        return diff
    for message in reversed(context.messages):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return None
