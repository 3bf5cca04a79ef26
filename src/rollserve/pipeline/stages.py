"""What each pipeline stage does to one job: init makes and prepares the run sandbox, run drives
the agent, eval scores the outcome (in a fresh sandbox when the task needs one)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rollserve.agents.base import RunContext, ShapesSandbox, TurnHook
from rollserve.errors import LayerLostError
from rollserve.gateway.keys import Gateway
from rollserve.llm.session import Models, ModelSession, VersionBound
from rollserve.pipeline.layers import Layers
from rollserve.plugins import Plugins
from rollserve.sandbox import SandboxInstance, SandboxManager
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, AgentRun, ExitReason, JobRequest, RolloutResult
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import Bind, SandboxSpec
from rollserve.schema.tokens import Tokens
from rollserve.settings import Settings
from rollserve.tasks.base import Evaluation, HasStageTimeouts


def agent_config(request: JobRequest) -> AgentConfig:
    return request.agent or AgentConfig()


def validate(request: JobRequest, plugins: Plugins, sandboxes: SandboxManager) -> None:
    """Everything about a request that can be checked before it is queued: the task kind, the
    agent, the sandbox backend, kind- and agent-specific fields. Raises InvalidInputError."""
    handler = plugins.handlers.get(request.task.kind)
    handler.validate(request.task)
    config = agent_config(request)
    plugins.agents.get(config.name).validate(config)
    if request.task.sandbox is not None and request.task.sandbox.backend is not None:
        sandboxes.backends.get(request.task.sandbox.backend)


def stage_timeout(
    request: JobRequest, name: str, default: float, handler: object | None = None
) -> float:
    """The job's active-time limit for a stage (``init_s``, ``run_s``, ``eval_s``): the
    request's, else the task's own (a handler's ``stage_timeouts``), else the server's
    ``default``."""
    value = getattr(request.timeouts, name, None) if request.timeouts else None
    if value is None and isinstance(handler, HasStageTimeouts):
        value = handler.stage_timeouts(request.task).get(name)
    return float(value) if value is not None else default


def base_spec(request: JobRequest, sandboxes: SandboxManager) -> SandboxSpec:
    """The sandbox spec from the server's defaults and the task's own choices."""
    ref = request.task.sandbox
    fields: dict[str, Any] = {}
    if ref is not None:
        if ref.image is not None:
            fields["image"] = ref.image
        if ref.workspace is not None:
            fields["workspace"] = ref.workspace
        fields["network"] = ref.network
        if ref.limits is not None:
            fields["limits"] = ref.limits
    default = sandboxes.settings.default_sandbox_backend
    return sandboxes.spec_for((ref.backend if ref and ref.backend else None) or default, **fields)


class StageRunner:
    """The work of the three stages, given the node's sandboxes and plug-ins."""

    def __init__(
        self,
        settings: Settings,
        sandboxes: SandboxManager,
        plugins: Plugins,
        models: Models | None = None,
        gateway: Gateway | None = None,
    ) -> None:
        self.settings = settings
        self.sandboxes = sandboxes
        self.plugins = plugins
        self.models = models
        self.gateway = gateway if gateway is not None else Gateway()
        self.layers = Layers(settings.data_dir)

    def timeout(self, request: JobRequest, name: str) -> float:
        """The job's limit for a stage (``init_s``, ``run_s``, ``eval_s``; see
        ``stage_timeout``), the server's setting by default."""
        default = getattr(self.settings, name.removesuffix("_s") + "_timeout_s")
        handler = self.plugins.handlers.get(request.task.kind)
        return stage_timeout(request, name, float(default), handler)

    async def init(self, request: JobRequest) -> SandboxInstance | None:
        handler = self.plugins.handlers.get(request.task.kind)
        spec = handler.sandbox_spec(request.task, base_spec(request, self.sandboxes))
        if spec is None:
            return None
        config = agent_config(request)
        agent = self.plugins.agents.get(config.name)
        if isinstance(agent, ShapesSandbox):  # an agent process needs its door in the sandbox
            spec = await asyncio.to_thread(agent.sandbox_spec, config, spec, self.settings)
        sandbox = await self.sandboxes.start(spec)
        try:
            await handler.prepare(request.task, sandbox)
        except BaseException:
            await self.sandboxes.close(sandbox)
            raise
        return sandbox

    async def run(
        self,
        job_id: str,
        request: JobRequest,
        sandbox: Sandbox | None,
        timeout_s: float,
        on_turn: TurnHook | None = None,
    ) -> RunOutput:
        """The episode; one cut off by its time limit keeps what it recorded (``timeout``).
        ``on_turn`` is told of each turn as it ends."""
        config = agent_config(request)
        agent = self.plugins.agents.get(config.name)
        handler = self.plugins.handlers.get(request.task.kind)
        bound = VersionBound(request.max_staleness, request.min_policy_version)
        llm = self.models.session(job_id, request.model, bound) if self.models else None
        context = RunContext(
            request=request,
            llm=llm,
            system_prompt=handler.system_prompt(request.task),
            tools=handler.tools(request.task),
            on_turn=on_turn,
            job_id=job_id,
            gateway=self.gateway,
            settings=self.settings,
        )
        try:
            async with asyncio.timeout(None) as limit:
                watch = asyncio.create_task(_expire(limit, timeout_s, llm))
                try:
                    output = await agent.run(sandbox, config, context)
                finally:
                    watch.cancel()
        except TimeoutError:
            output = context.output(ExitReason.TIMEOUT)
        if llm is not None:
            llm.check_stale()  # a rollout already stale is not worth evaluating
        if isinstance(sandbox, SandboxInstance) and sandbox.has_layer:
            # What it wrote anywhere in its filesystem is what evaluation looks at.
            layer = await self.layers.prepare(job_id)
            await sandbox.close_keeping_layer(layer)
            output.layer = str(layer)
        return output

    async def admitted(self, request: JobRequest) -> None:
        """Wait while new jobs of the request's model are held by a pause."""
        if self.models is not None:
            await self.models.router.admitted(request.model)

    @staticmethod
    def unscored(output: RunOutput, reason: str) -> RolloutResult:
        """A result with reward 0 because the run's outcome could not be scored."""
        return _result(output, Evaluation(reward=0.0, details={"error": reason}))

    async def evaluate(self, request: JobRequest, output: RunOutput) -> RolloutResult:
        handler = self.plugins.handlers.get(request.task.kind)

        @asynccontextmanager
        async def fresh_sandbox(binds: Sequence[Bind] = ()) -> AsyncIterator[Sandbox]:
            spec = handler.sandbox_spec(request.task, base_spec(request, self.sandboxes))
            if spec is None:
                raise RuntimeError(f"task kind {request.task.kind!r} has no sandbox to open")
            changes: dict[str, Any] = {"binds": [*spec.binds, *binds]}
            if output.layer is not None:  # the run's filesystem, under a fresh layer
                if not await asyncio.to_thread(os.path.isdir, output.layer):
                    raise LayerLostError(
                        f"the run's layer {output.layer} is gone (the node that ran the job "
                        "holds it): the job runs again",
                        layer=output.layer,
                    )
                changes.update(writable_root=True, lower_layers=[Path(output.layer)])
            spec = spec.model_copy(update=changes)
            sandbox = await self.sandboxes.start(spec)
            try:
                yield sandbox
            finally:
                await self.sandboxes.close(sandbox)

        return _result(output, await handler.evaluate(request.task, output, fresh_sandbox))


def _result(output: RunOutput, evaluation: Evaluation) -> RolloutResult:
    return RolloutResult(
        reward=evaluation.reward,
        evaluation=evaluation.details,
        exit_reason=output.exit_reason,
        messages=output.messages,
        turn_log=output.turn_log,
        turns=output.turns,
        patch=evaluation.patch,
        tokens=Tokens.model_validate(output.tokens) if output.tokens else None,
        segments=[Tokens.model_validate(s) for s in output.segments],
        agent_run=AgentRun.model_validate(output.agent_run) if output.agent_run else None,
        tool_errors=output.tool_errors,
        min_policy_version=min(output.policy_versions, default=None),
        max_policy_version=max(output.policy_versions, default=None),
    )


async def _expire(limit: asyncio.Timeout, timeout_s: float, llm: ModelSession | None) -> None:
    """End the run once it has been active ``timeout_s``: time its model spent paused for a
    weight update does not count. It wakes at the deadline, and again only while a pause
    moves the deadline on."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    paused = llm.stalled_s() if llm is not None else 0.0
    while True:
        if llm is not None and llm.paused():  # paused time never ends a run
            await asyncio.sleep(1.0)
            continue
        stalled = (llm.stalled_s() if llm is not None else 0.0) - paused
        left = started + timeout_s + stalled - loop.time()
        if left <= 0:
            limit.reschedule(loop.time())
            return
        await asyncio.sleep(left)
