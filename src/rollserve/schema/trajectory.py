"""The typed trajectory: chat messages with their tool calls, what each tool run returned, and
each model turn's backend, policy version, tokens and latency. Everything that reads a rollout
(the trainer adapters, the web viewer, exports) reads these types.

``RolloutResult.messages`` holds :class:`Message` values and ``RolloutResult.turn_log`` one
:class:`TurnLog` per model turn; :func:`split_turns` puts the two together turn by turn."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from rollserve.schema.tokens import TurnInfo

Role = Literal["system", "developer", "user", "assistant", "tool"]


class FunctionCall(BaseModel):
    """The function a tool call names, with its arguments as the model wrote them (a JSON
    object in a string, OpenAI's format)."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str = "{}"


class ChatToolCall(BaseModel):
    """One tool call of an assistant message, in OpenAI chat format."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @property
    def name(self) -> str:
        return self.function.name

    def parsed_arguments(self) -> dict[str, Any] | None:
        """The arguments as an object; None when they are not a JSON object."""
        try:
            found = json.loads(self.function.arguments or "{}")
        except ValueError:
            return None
        return found if isinstance(found, dict) else None


class Message(BaseModel):
    """One chat message in OpenAI format. Fields a template or server adds (reasoning
    content …) are kept; absent fields stay absent on the wire."""

    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[Any] | None = ""
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_serializer(mode="wrap")
    def _without_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k == "content"}

    @property
    def text(self) -> str:
        """The content as text (the text parts of a multi-part content)."""
        if isinstance(self.content, str):
            return self.content
        if self.content is None:
            return ""
        parts = [p.get("text", "") for p in self.content if isinstance(p, dict)]
        return "".join(str(p) for p in parts)


class ToolRun(BaseModel):
    """What one tool call did in the sandbox: the message holding its output is the ``tool``
    message with the same ``tool_call_id``."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str | None = None
    name: str
    exit_code: int | None = Field(None, description="bash: the command's exit code")
    timed_out: bool = False
    truncated: bool = Field(False, description="the output was cut (head and tail kept)")
    error: bool = Field(False, description="a malformed or failed call, told to the model")
    seconds: float = 0.0


class TurnLog(BaseModel):
    """One model turn: where and how it was generated, and the tool runs it asked for."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=1, description="1 for the first model turn")
    started_s: float = Field(0.0, description="seconds since the episode started")
    info: TurnInfo | None = None
    tools: list[ToolRun] = Field(default_factory=list)
    segment: int | None = Field(None, description="token mode: the token segment it belongs to")
    mode: Literal["token", "text"] | None = Field(
        None, description="how the gateway served it: token ids, or text passed through"
    )


class Turn(BaseModel):
    """One turn put together: the assistant message, what came back (tool outputs, notes to
    the model), its tool runs and its generation details."""

    index: int = Field(ge=1)
    messages: list[Message]
    tools: list[ToolRun] = Field(default_factory=list)
    info: TurnInfo | None = None
    started_s: float | None = None
    segment: int | None = Field(None, description="token mode: the token segment it belongs to")
    mode: Literal["token", "text"] | None = None


def split_turns(
    messages: list[Message], turn_log: list[TurnLog]
) -> tuple[list[Message], list[Turn]]:
    """The messages before the first model turn (system, task), and the turns: each starts at
    an assistant message and holds what followed it, matched with its log by position."""
    logs = {log.turn: log for log in turn_log}
    prelude: list[Message] = []
    turns: list[Turn] = []
    for message in messages:
        if message.role == "assistant":
            log = logs.get(len(turns) + 1)
            turns.append(
                Turn(
                    index=len(turns) + 1,
                    messages=[message],
                    tools=log.tools if log else [],
                    info=log.info if log else None,
                    started_s=log.started_s if log else None,
                    segment=log.segment if log else None,
                    mode=log.mode if log else None,
                )
            )
        elif turns:
            turns[-1].messages.append(message)
        else:
            prelude.append(message)
    return prelude, turns
