"""The OpenAI chat API as the gateway takes it: a chat completion request (fields an SDK adds
that the gateway has no use for are accepted and ignored) and OpenAI's error body."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ChatRequest(BaseModel):
    """``POST …/chat/completions``: what an agent asks for one turn."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="ignored: the job's model answers")
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per call: a trajectory is one path")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, message in enumerate(value):
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise ValueError(
                    f"messages[{index}].role must be system, developer, user, "
                    f"assistant or tool, not {role!r}"
                )
            if role == "tool" and not isinstance(message.get("tool_call_id"), str):
                raise ValueError(f"messages[{index}]: a tool message needs its tool_call_id")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, tool in enumerate(value or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type", "function") != "function" or not isinstance(function, dict):
                raise ValueError(f"tools[{index}] must be {{'type': 'function', 'function': …}}")
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise ValueError(f"tools[{index}].function.name must be a non-empty string")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def parses_tools(self) -> bool:
        """Whether tool calls are read out of the reply (tools offered, choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"


ErrorType = Literal["invalid_request_error", "not_found_error", "server_error", "rate_limit_error"]


def error_body(
    message: str, *, type: ErrorType, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An error in OpenAI's shape, which the SDKs raise as their own exceptions."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class OpenAIErrorDetail(BaseModel):
    message: str
    type: ErrorType
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """What the gateway answers when it refuses a call: OpenAI's error shape."""

    error: OpenAIErrorDetail
