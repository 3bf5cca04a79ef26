"""A served call written as OpenAI writes it: a chat completion, or the same as server-sent
events in OpenAI's chunk format (role, content, tool calls, finish reason, usage, [DONE])."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from rollserve.gateway.job import Reply


def _logprobs(reply: Reply) -> dict[str, Any] | None:
    if reply.logprobs is None:
        return None
    return {
        "content": [
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode("utf-8", "surrogatepass")),
                "top_logprobs": [],
            }
            for text, logprob in reply.logprobs
        ]
    }


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def completion(reply: Reply) -> dict[str, Any]:
    """``chat.completion``."""
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model,
        "choices": [
            {
                "index": 0,
                "message": reply.message,
                "logprobs": _logprobs(reply),
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": _usage(reply),
    }


def chunks(reply: Reply, *, include_usage: bool) -> Iterator[bytes]:
    """``chat.completion.chunk`` events: the role, the content, each tool call (its name and
    id, then its arguments), the finish reason, the usage when asked, then ``[DONE]``."""
    base = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": reply.model,
    }

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
        body = {**base, "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    yield event({"role": "assistant", "content": ""})
    content = reply.message.get("content")
    if content:
        yield event({"content": content}, logprobs=_logprobs(reply))
    for index, call in enumerate(reply.message.get("tool_calls") or []):
        function = call["function"]
        opening = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        yield event({"tool_calls": [opening]})
        arguments = {"index": index, "function": {"arguments": function["arguments"]}}
        yield event({"tool_calls": [arguments]})
    yield event({}, reply.finish_reason)
    if include_usage:
        body = {**base, "choices": [], "usage": _usage(reply)}
        yield b"data: " + json.dumps(body).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
