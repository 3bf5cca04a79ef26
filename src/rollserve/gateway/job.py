"""One running job as its gateway serves it: each chat call becomes a model turn, in token
mode prefix-matched against the job's segments so that a turn's prompt is the previous
turn's exact ids plus the template's suffix for the new messages; a history that extends no
segment starts a new one. The job's limits are enforced here, and every turn is recorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollserve.errors import InfrastructureError, InvalidInputError, StaleRolloutError
from rollserve.gateway.base import Refusal
from rollserve.gateway.history import Normal, extends, normal, tools_key, why_new
from rollserve.gateway.sandbox import JobSandbox
from rollserve.llm.base import SamplingParams
from rollserve.llm.session import ModelSession
from rollserve.llm.toolcalls import ParsedTurn, ToolCallParser
from rollserve.schema.jobs import AgentConfig, ExitReason, Sampling
from rollserve.schema.openai import ChatRequest
from rollserve.schema.tokens import Tokens, TurnInfo
from rollserve.schema.trajectory import TurnLog

SEGMENT_NOTE = "rollserve.segment"  # the name of the note that marks where a segment begins
_TURN_TOKENS = 4096  # a call's generation limit when neither the agent nor the job names one
# Told of each turn as it is recorded: its number, the messages it added, its log.
TurnHook = Callable[[int, list[dict[str, Any]], TurnLog], Awaitable[None]]


@dataclass
class Reply:
    """One served call: the assistant message and what the OpenAI answer reports of it."""

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    logprobs: list[tuple[str, float]] | None = None  # (token text, logprob), when asked


@dataclass
class _Segment:
    """A run of turns that each extend the one before, exactly (token mode: ``tokens``)."""

    index: int
    tools: str
    history: list[Normal] = field(default_factory=list)
    tokens: Tokens | None = None
    generated: list[int] = field(default_factory=list)  # the last turn's ids
    busy: bool = False  # a call extending it is in flight: a concurrent one cannot


class GatewayJob:
    """The gateway side of one job's run stage."""

    def __init__(
        self,
        job_id: str,
        model: str | None,
        llm: ModelSession,
        parser: ToolCallParser | None,
        config: AgentConfig,
        sampling: Sampling | None,
        on_turn: TurnHook | None = None,
        task: dict[str, Any] | None = None,
    ) -> None:
        self.job_id = job_id
        self.task = dict(task or {})  # the job's task, for a harness to read
        self.model = model or "rollserve"
        self.llm = llm
        self.parser = parser  # None: the chat template's own format, found at the first call
        self.config = config
        self.sampling = sampling
        self.on_turn = on_turn
        self.started = time.monotonic()
        self.segments: list[_Segment] = []
        self.last: _Segment | None = None  # the segment of the latest turn
        self.messages: list[dict[str, Any]] = []
        self.turn_log: list[TurnLog] = []
        self.calls = 0  # calls served
        self.refused = 0
        self.generated = 0
        self.ended: ExitReason | None = None  # a limit ended the episode
        self.failure: Exception | None = None  # rollserve's machinery failed: a retry
        self.changed = asyncio.Event()  # set when ended or failed
        self.submitted: str | None = None  # what a harness submitted
        self._sandbox: JobSandbox | None = None

    def attach(self, sandbox: JobSandbox) -> None:
        """Let the job's harness drive ``sandbox`` through the gateway."""
        self._sandbox = sandbox

    def sandbox(self) -> JobSandbox:
        if self._sandbox is None:
            raise Refusal(409, f"job {self.job_id} offers no sandbox to its agent", "no_sandbox")
        return self._sandbox

    # -- limits ---------------------------------------------------------------------------------

    def end(self, reason: ExitReason) -> None:
        if self.ended is None:
            self.ended = reason
        self.changed.set()

    def _refuse(self, status: int, message: str, code: str, param: str | None = None) -> Refusal:
        self.refused += 1
        return Refusal(status, message, code, param=param)

    def _check_limits(self) -> None:
        if self.ended is not None:
            raise self._refuse(400, f"the episode has ended ({self.ended})", str(self.ended))
        if self.calls >= self.config.max_turns:
            self.end(ExitReason.MAX_TURNS)
            raise self._refuse(
                400, f"the job allows {self.config.max_turns} model calls (max_turns)", "max_turns"
            )
        budget = self.config.max_tokens
        if budget is not None and self.generated >= budget:
            self.end(ExitReason.MAX_TOKENS)
            raise self._refuse(
                400,
                f"the job's budget of {budget} generated tokens is spent (max_tokens)",
                "max_tokens",
            )

    def _turn_tokens(self, request: ChatRequest, room: int | None) -> int:
        """What this call may generate: the agent's ask, within the job's per-turn limit, its
        generated-token budget and the context left."""
        asked = request.max_completion_tokens or request.max_tokens
        job = self.sampling.max_tokens if self.sampling else None
        bounds = [n for n in (asked, job, room) if n]
        if self.config.max_tokens is not None:
            bounds.append(self.config.max_tokens - self.generated)
        return min(bounds) if bounds else _TURN_TOKENS

    def _sampling(
        self, request: ChatRequest, max_tokens: int, stops: tuple[int, ...]
    ) -> SamplingParams:
        """The job's sampling wins for every field it sets; the agent's ask fills the rest."""
        fixed = self.sampling.model_fields_set if self.sampling else set()
        values = (self.sampling or Sampling()).model_dump(exclude={"max_tokens"})
        for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"):
            asked = getattr(request, name)
            if asked is not None and name not in fixed:
                values[name] = asked
        return SamplingParams(
            max_tokens=max_tokens, stop_token_ids=stops, stop=request.stops, **values
        )

    # -- calls ----------------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> Reply:
        """Serve one call; a Refusal for the agent, or InfrastructureError/StaleRolloutError
        recorded in ``failure`` (the job is then retried or ends stale, not the agent's
        fault)."""
        self._check_limits()
        began = round(time.monotonic() - self.started, 6)
        self.calls += 1
        try:
            if self.llm.token_mode:
                return await self._token_call(request, began)
            return await self._text_call(request, began)
        except (InfrastructureError, StaleRolloutError) as exc:
            self.failure = exc
            self.changed.set()
            raise Refusal(
                503, f"rollserve could not serve the call: {exc}", "unavailable", "server_error"
            ) from exc

    def _segment_for(self, messages: list[Normal], tools: str) -> tuple[_Segment | None, str]:
        """The segment the request extends (None: a new one), or why it extends none."""
        reason = "the first call"
        for segment in reversed(self.segments):
            if segment.busy:
                continue
            same_tools = segment.tools == tools
            if same_tools and extends(segment.history, messages):
                return segment, ""
            if segment is self.segments[-1]:
                reason = why_new(segment.history, messages, same_tools)
        return None, reason

    async def _token_call(self, request: ChatRequest, began: float) -> Reply:
        template = self.llm.template
        assert template is not None
        normals = [normal(m) for m in request.messages]
        key = tools_key(request.tools)
        segment, reason = self._segment_for(normals, key)
        suffix: list[int] = []
        if segment is not None:
            assert segment.tokens is not None
            new = request.messages[len(segment.history) :]
            try:
                suffix = template.suffix_ids(new, request.tools, generated_tail=segment.generated)
            except InvalidInputError as exc:
                segment, reason = None, exc.message
        if segment is None:
            try:
                prompt = template.prompt_ids(request.messages, request.tools)
            except Exception as exc:  # the template refused the conversation (jinja raises)
                raise self._refuse(
                    400,
                    f"the chat template cannot render the messages: {exc}",
                    "invalid_messages",
                    "messages",
                ) from exc
            segment = _Segment(index=len(self.segments), tools=key)
            segment.tokens = Tokens(
                prompt_ids=prompt,
                logprob_mode=self.llm.logprob_mode,
                segment=segment.index,
                started_by=reason,
            )
            fresh = True
        else:
            assert segment.tokens is not None
            prompt = segment.tokens.prompt_ids + segment.tokens.response_ids + suffix
            fresh = False
        limit = self.llm.context_limit
        room = limit - len(prompt) if limit else None
        if room is not None and room <= 0:
            self.end(ExitReason.MAX_TOKENS)
            raise self._refuse(
                400,
                f"the prompt has {len(prompt)} tokens; the context holds {limit}",
                "context_length_exceeded",
                "messages",
            )
        max_tokens = self._turn_tokens(request, room)
        segment.busy = True
        try:
            done, info = await self.llm.complete_tokens(
                prompt, self._sampling(request, max_tokens, template.stop_ids)
            )
        finally:
            segment.busy = False
        added = self._unrecorded(request, segment, fresh, reason)
        if fresh:
            self.segments.append(segment)
        self.last = segment
        tokens = segment.tokens
        assert tokens is not None
        tokens.response_ids += suffix
        tokens.response_mask += [0] * len(suffix)
        tokens.response_logprobs += [0.0] * len(suffix)
        tokens.turns.append(info)
        tokens.response_ids += done.token_ids
        tokens.response_mask += [1] * len(done.token_ids)
        tokens.response_logprobs += done.logprobs
        self.generated += len(done.token_ids)
        ids = done.token_ids
        if ids and ids[-1] in template.stop_ids:
            ids = ids[:-1]
        text, stopped = _cut_at_stop(template.decode(ids), request.stops)
        parsed = self._parse(request, text)
        message = self._assistant(parsed, text)
        segment.history = [*normals, normal(message)]
        segment.generated = done.token_ids
        logprobs = None
        if request.logprobs:
            pieces = template.pieces(done.token_ids)
            logprobs = list(zip(pieces, done.logprobs, strict=True))
        reply = Reply(
            message=message,
            finish_reason=self._finish(parsed, "stop" if stopped else done.finish_reason, message),
            prompt_tokens=len(prompt),
            completion_tokens=len(done.token_ids),
            model=self.model,
            logprobs=logprobs,
        )
        await self._record(added, segment, message, info, began, "token")
        return reply

    async def _text_call(self, request: ChatRequest, began: float) -> Reply:
        normals = [normal(m) for m in request.messages]
        key = tools_key(request.tools)
        segment, reason = self._segment_for(normals, key)
        fresh = segment is None
        if segment is None:
            segment = _Segment(index=len(self.segments), tools=key)
        max_tokens = self._turn_tokens(request, None)
        segment.busy = True
        try:
            done, info = await self.llm.chat(
                request.messages, request.tools, self._sampling(request, max_tokens, ())
            )
        finally:
            segment.busy = False
        added = self._unrecorded(request, segment, fresh, reason)
        if fresh:
            self.segments.append(segment)
        self.last = segment
        self.generated += info.generated_tokens
        message: dict[str, Any] = {"role": "assistant", "content": done.content}
        if done.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in done.tool_calls
            ]
        segment.history = [*normals, normal(message)]
        finish = "tool_calls" if done.tool_calls else done.finish_reason
        await self._record(added, segment, message, info, began, "text")
        return Reply(
            message=message,
            finish_reason=finish if finish in ("stop", "length", "tool_calls") else "stop",
            prompt_tokens=info.prompt_tokens,
            completion_tokens=info.generated_tokens,
            model=self.model,
        )

    def _parse(self, request: ChatRequest, text: str) -> ParsedTurn:
        if not request.parses_tools or self.parser is None:
            return ParsedTurn(content=text)
        parsed = self.parser.parse(text)
        if parsed.errors:  # a malformed call: the agent gets the text as the model wrote it
            return ParsedTurn(content=text)
        return parsed

    def _assistant(self, parsed: ParsedTurn, text: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            assert self.parser is not None
            calls = []
            for index, call in enumerate(parsed.calls):
                openai = call.to_openai()
                openai["id"] = self.parser.turn_call_id(self.calls, index)
                calls.append(openai)
            message["tool_calls"] = calls
            if not parsed.content:
                message["content"] = None
        return message

    @staticmethod
    def _finish(parsed: ParsedTurn, finish: str, message: dict[str, Any]) -> str:
        if message.get("tool_calls"):
            return "tool_calls"
        return "length" if finish == "length" else "stop"

    async def _record(
        self,
        added: list[dict[str, Any]],
        segment: _Segment,
        message: dict[str, Any],
        info: TurnInfo,
        began: float,
        mode: str,
    ) -> None:
        """The turn joins the job's messages and log, and the hook is told of it."""
        added = [*added, message]
        self.messages += added
        log = TurnLog(
            turn=len(self.turn_log) + 1,
            started_s=began,
            info=info,
            segment=segment.index,
            mode="token" if mode == "token" else "text",
        )
        self.turn_log.append(log)
        if self.on_turn is not None:
            await self.on_turn(log.turn, added, log)

    def _unrecorded(
        self, request: ChatRequest, segment: _Segment, fresh: bool, reason: str
    ) -> list[dict[str, Any]]:
        """The request's messages the job has not recorded yet: all of a first call's; what
        followed the segment's previous turn; for a new segment, a note of why it began and
        what followed the history's last reply."""
        if not fresh:
            return list(request.messages[len(segment.history) :])
        if not self.segments:
            return list(request.messages)
        last = max(
            (i for i, m in enumerate(request.messages) if m.get("role") == "assistant"),
            default=-1,
        )
        note = {
            "role": "system",
            "name": SEGMENT_NOTE,
            "content": f"segment {segment.index} begins: {reason}",
        }
        return [note, *request.messages[last + 1 :]]


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """The reply up to the first of the agent's stop strings (excluded, as OpenAI answers),
    and whether one was found. The generated tokens stay whole in the trajectory: they are
    what the policy produced, whether or not the backend stopped at the string."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    if not found:
        return text, False
    return text[: min(found)], True
