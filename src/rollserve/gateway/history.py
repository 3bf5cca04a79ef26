"""When an agent's new request extends a conversation the gateway already served: messages
compared by what the chat template renders of them, not by how an SDK spells them (an
absent field, ``None`` and ``""`` are the same content; tool-call arguments are compared as
JSON values; fields a template never reads are left out)."""

from __future__ import annotations

import json
from typing import Any

Normal = tuple[Any, ...]


def _text(content: Any) -> Any:
    """Content as the template sees it: text parts joined; other parts kept as they are."""
    if content is None:
        return ""
    if isinstance(content, list):
        if all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return "".join(str(p.get("text", "")) for p in content)
        return json.dumps(content, sort_keys=True)
    return content


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.dumps(json.loads(value), sort_keys=True)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True)


def normal(message: dict[str, Any]) -> Normal:
    """The parts of a message that decide what the template renders."""
    calls = tuple(
        (
            call.get("id"),
            (call.get("function") or {}).get("name"),
            _arguments((call.get("function") or {}).get("arguments")),
        )
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    )
    return (
        message.get("role"),
        _text(message.get("content")),
        calls,
        message.get("tool_call_id"),
        message.get("name") if message.get("role") == "tool" else None,
        message.get("reasoning_content") or None,
    )


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


def extends(history: list[Normal], messages: list[Normal]) -> bool:
    """Whether ``messages`` is ``history`` followed by at least one new message."""
    return len(messages) > len(history) and messages[: len(history)] == history


def why_new(history: list[Normal], messages: list[Normal], same_tools: bool) -> str:
    """Why ``messages`` does not extend ``history``, in words for the trajectory."""
    if not same_tools:
        return "the request's tools differ from the segment's"
    for index, (old, new) in enumerate(zip(history, messages, strict=False)):
        if old != new:
            role = old[0]
            return f"the agent's history differs from the segment's at message {index} ({role})"
    if len(messages) <= len(history):
        return f"the agent's history holds {len(messages)} messages, the segment {len(history)}"
    return "the agent's history does not extend the segment's"
