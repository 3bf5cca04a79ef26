"""The default agent: the model calls tools (``bash``, ``submit``) turn after turn until it
submits or a turn, token or time limit ends the episode. In token mode the trajectory is kept
as the exact token ids the backend saw and produced (never re-tokenized)."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollserve.agents.base import RunContext
from rollserve.agents.tools import Toolbox, ToolOutcome, tool_schemas
from rollserve.errors import InvalidInputError
from rollserve.llm.base import SamplingParams
from rollserve.llm.session import ModelSession
from rollserve.llm.toolcalls import ParsedTurn, ToolCall, ToolCallParser
from rollserve.registry import Registry
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import AgentConfig, ExitReason, Sampling
from rollserve.schema.run import RunOutput
from rollserve.schema.tokens import Tokens, TurnInfo
from rollserve.schema.trajectory import ToolRun, TurnLog

_TURN_TOKENS = 1024  # a turn's generation limit when the job's sampling names none


class ToolAgentSettings(BaseModel):
    """The tool agent's own fields of ``agent`` (besides name and limits)."""

    model_config = ConfigDict(extra="forbid")

    parser: str = Field("hermes", description="how tool calls are read from generated text")
    system_prompt: str | None = Field(None, description="replaces the task family's prompt")
    end_without_tool_call: bool = Field(
        True, description="a reply that calls no tool is the final answer"
    )


class ToolAgent:
    """Agent ``tool``: a multi-turn tool loop against the job's model."""

    name = "tool"

    def __init__(self, parsers: Registry[ToolCallParser]) -> None:
        self.parsers = parsers

    def settings(self, config: AgentConfig) -> ToolAgentSettings:
        try:
            own = ToolAgentSettings.model_validate(config.model_extra or {})
        except ValidationError as exc:
            problem = exc.errors()[0]
            field = ".".join(str(p) for p in problem["loc"])
            raise InvalidInputError(
                f"agent.{field}: {problem['msg']}", field=f"agent.{field}"
            ) from exc
        self.parsers.get(own.parser)
        return own

    def validate(self, config: AgentConfig) -> None:
        self.settings(config)

    async def run(
        self, sandbox: Sandbox | None, config: AgentConfig, context: RunContext
    ) -> RunOutput:
        own = self.settings(config)
        if context.llm is None:
            raise InvalidInputError("agent 'tool' needs a model: register a backend first")
        await context.llm.open()
        context.messages = [
            {"role": "system", "content": own.system_prompt or context.system_prompt},
            {"role": "user", "content": context.request.task.prompt},
        ]
        episode = _Episode(context, context.llm, self.parsers.get(own.parser), own, config)
        toolbox = Toolbox(sandbox, context.tools, config.command_timeout_s)
        try:
            return await episode.play(toolbox)
        finally:
            await toolbox.close()


class _Episode:
    """One episode's loop; token and text mode differ only in how a turn is generated."""

    def __init__(
        self,
        context: RunContext,
        llm: ModelSession,
        parser: ToolCallParser,
        own: ToolAgentSettings,
        config: AgentConfig,
    ) -> None:
        self.context = context
        self.llm = llm
        self.parser = parser
        self.own = own
        self.config = config
        self.tools = tool_schemas(context.tools)
        sampling = context.request.sampling
        self.turn_tokens = (sampling.max_tokens if sampling else None) or _TURN_TOKENS
        limits = [n for n in (llm.context_limit, config.max_tokens) if n]
        self.budget = min(limits) if limits else None  # the whole trajectory's tokens
        if llm.token_mode:
            assert llm.template is not None
            prompt = llm.template.prompt_ids(context.messages, self.tools)
            context.tokens = Tokens(prompt_ids=prompt, logprob_mode=llm.logprob_mode)

    def sampling(self, max_tokens: int) -> SamplingParams:
        given = (self.context.request.sampling or Sampling()).model_dump(exclude={"max_tokens"})
        stops = self.llm.template.stop_ids if self.llm.template else ()
        return SamplingParams(max_tokens=max_tokens, stop_token_ids=stops, **given)

    async def play(self, toolbox: Toolbox) -> RunOutput:
        context = self.context
        await context.told(0, list(context.messages), None)
        while True:
            began = round(time.monotonic() - context.started, 6)
            turn = await (self.token_turn() if self.llm.token_mode else self.text_turn())
            if turn is None:
                return context.output(ExitReason.MAX_TOKENS)
            parsed, info, generated = turn
            log = context.begin_turn(info, began)
            context.messages.append(_assistant(parsed))
            ended = await self.turn(toolbox, parsed, log, generated)
            if ended is not None:
                return context.output(ended)

    async def turn(
        self, toolbox: Toolbox, parsed: ParsedTurn, log: TurnLog, generated: list[int]
    ) -> ExitReason | None:
        """Act on one generated turn and tell the hook; how the episode ends, if it does."""
        context = self.context
        assistant = context.messages[-1]
        if log.info is not None and log.info.truncated:
            await context.told(log.turn, [assistant], log)
            return ExitReason.MAX_TOKENS
        ended = log.info is None or log.info.finish_reason in ("stop", "tool_calls")
        final = not parsed.calls and not parsed.errors and ended  # not cut short: an answer
        if final and self.own.end_without_tool_call:
            await context.told(log.turn, [assistant], log)
            return ExitReason.SUBMITTED
        observations, submitted = await self.act(toolbox, parsed, log)
        await context.told(log.turn, [assistant, *observations], log)
        if submitted:
            return ExitReason.SUBMITTED
        if context.turns >= self.config.max_turns:
            # No model will read these observations: the tokens end with the last reply.
            return ExitReason.MAX_TURNS
        if not self.observe(observations, generated):
            return ExitReason.MAX_TOKENS
        return None

    async def token_turn(self) -> tuple[ParsedTurn, TurnInfo, list[int]] | None:
        tokens = self.context.tokens
        assert tokens is not None and self.llm.template is not None
        used = len(tokens.prompt_ids) + len(tokens.response_ids)
        room = self.budget - used if self.budget else None
        if room is not None and room <= 0:
            return None
        limit = min(self.turn_tokens, room) if room is not None else self.turn_tokens
        done, info = await self.llm.complete_tokens(
            tokens.prompt_ids + tokens.response_ids, self.sampling(limit)
        )
        info.truncated = done.finish_reason == "length" and room is not None and limit == room
        tokens.turns.append(info)
        tokens.response_ids += done.token_ids
        tokens.response_mask += [1] * len(done.token_ids)
        tokens.response_logprobs += done.logprobs
        ids = done.token_ids
        if ids and ids[-1] in self.llm.template.stop_ids:
            ids = ids[:-1]
        return self.parser.parse(self.llm.template.decode(ids)), info, done.token_ids

    async def text_turn(self) -> tuple[ParsedTurn, TurnInfo, list[int]] | None:
        done, info = await self.llm.chat(
            self.context.messages, self.tools, self.sampling(self.turn_tokens)
        )
        total = info.prompt_tokens + info.generated_tokens
        info.truncated = done.finish_reason == "length" and bool(
            self.budget and total >= self.budget
        )
        if not done.tool_calls:
            return self.parser.parse(done.content), info, []
        calls, errors = [], []
        for index, call in enumerate(done.tool_calls):
            try:
                arguments = json.loads(call["arguments"] or "{}")
                if not isinstance(arguments, dict):
                    raise ValueError("the arguments are not a JSON object")
                calls.append(ToolCall(name=call["name"], arguments=arguments, id=call["id"]))
            except ValueError as exc:
                errors.append(f"tool call {index + 1} ({call['name']}): invalid arguments: {exc}")
        return ParsedTurn(content=done.content, calls=calls, errors=errors), info, []

    async def act(
        self, toolbox: Toolbox, parsed: ParsedTurn, log: TurnLog
    ) -> tuple[list[dict[str, Any]], bool]:
        """Run the turn's calls, each logged; the observations to send back, and whether it
        submitted."""
        context = self.context
        observations: list[dict[str, Any]] = []
        for call in parsed.calls:
            began = time.monotonic()
            outcome = await toolbox.call(call)
            log.tools.append(_tool_run(call, outcome, time.monotonic() - began))
            context.tool_errors += outcome.error
            observations.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": outcome.output,
                }
            )
            if outcome.submitted:
                context.submission = outcome.submission
                context.messages += observations
                return observations, True
        if parsed.errors:
            context.tool_errors += len(parsed.errors)
            observations.append({"role": "user", "content": "\n".join(parsed.errors)})
        elif not parsed.calls:
            names = ", ".join(context.tools)
            observations.append(
                {"role": "user", "content": f"Call one of the tools ({names}) to go on."}
            )
        context.messages += observations
        return observations, False

    def observe(self, observations: list[dict[str, Any]], generated: list[int]) -> bool:
        """Token mode: append the template's tokens for the observations; False when they
        would not fit in the budget (the episode then ends as it stands)."""
        tokens = self.context.tokens
        if tokens is None:
            return True
        assert self.llm.template is not None
        ids = self.llm.template.suffix_ids(observations, self.tools, generated_tail=generated)
        used = len(tokens.prompt_ids) + len(tokens.response_ids) + len(ids)
        if self.budget is not None and used >= self.budget:
            return False
        tokens.response_ids += ids
        tokens.response_mask += [0] * len(ids)
        tokens.response_logprobs += [0.0] * len(ids)
        return True


def _tool_run(call: ToolCall, outcome: ToolOutcome, seconds: float) -> ToolRun:
    """What the log keeps of one tool call."""
    command = outcome.command
    return ToolRun(
        tool_call_id=call.id,
        name=call.name,
        exit_code=command.exit_code if command is not None else None,
        timed_out=command.timed_out if command is not None else False,
        truncated=command.truncated if command is not None else False,
        error=outcome.error,
        seconds=round(seconds, 6),
    )


def _assistant(parsed: ParsedTurn) -> dict[str, Any]:
    """The turn in OpenAI chat format (tool-call arguments as a JSON string)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        message["tool_calls"] = [call.to_openai() for call in parsed.calls]
    return message
