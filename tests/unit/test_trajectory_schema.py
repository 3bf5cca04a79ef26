"""The typed trajectory: token arrays that must agree, OpenAI messages kept as they came, and
messages and turn logs put together turn by turn."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollserve.schema.jobs import RolloutResult
from rollserve.schema.tokens import Tokens, TokenSpan, TurnInfo
from rollserve.schema.trajectory import Message, ToolRun, TurnLog, split_turns


def _info(start: int, end: int) -> TurnInfo:
    return TurnInfo(
        backend_id="b",
        model="m",
        finish_reason="stop",
        prompt=TokenSpan(start=0, end=start),
        generation=TokenSpan(start=start, end=end),
    )


def test_token_arrays_must_agree_in_length() -> None:
    good = Tokens(
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        response_mask=[1, 1, 0],
        response_logprobs=[-0.1, -0.2, 0.0],
        turns=[_info(2, 4)],
    )
    assert len(good.response_ids) == 3
    with pytest.raises(ValidationError, match="response_mask has 2 entries, response_ids 3"):
        Tokens(
            prompt_ids=[1], response_ids=[3, 4, 5], response_mask=[1, 1], response_logprobs=[0] * 3
        )
    with pytest.raises(ValidationError, match="response_logprobs has 1 entries, response_ids 2"):
        Tokens(prompt_ids=[1], response_ids=[3, 4], response_mask=[1, 1], response_logprobs=[0])
    with pytest.raises(ValidationError, match="other than 0 and 1"):
        Tokens(prompt_ids=[1], response_ids=[3], response_mask=[2], response_logprobs=[0])
    with pytest.raises(ValidationError, match=r"turns\[0\]: span \[2, 9\) is outside the 5"):
        Tokens(
            prompt_ids=[1, 2],
            response_ids=[3, 4, 5],
            response_mask=[1, 1, 0],
            response_logprobs=[0.0] * 3,
            turns=[_info(2, 9)],
        )


def test_messages_keep_their_openai_shape() -> None:
    raw = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ],
        "reasoning_content": "thinking",  # a server's own field, kept
    }
    message = Message.model_validate(raw)
    assert message.model_dump() == raw
    assert Message(role="user", content="hi").model_dump() == {"role": "user", "content": "hi"}
    assert message.tool_calls is not None and message.tool_calls[0].parsed_arguments() == {}
    bad = Message.model_validate(
        {**raw, "tool_calls": [{"id": "c", "function": {"name": "x", "arguments": "[1"}}]}
    )
    assert bad.tool_calls is not None and bad.tool_calls[0].parsed_arguments() is None
    with pytest.raises(ValidationError):
        Message.model_validate({"role": "narrator", "content": "x"})
    parts = Message.model_validate({"role": "user", "content": [{"type": "text", "text": "a"}]})
    assert parts.text == "a"


def test_turns_are_the_assistant_messages_with_what_followed() -> None:
    messages = [
        Message(role="system", content="s"),
        Message(role="user", content="task"),
        Message(role="assistant", content="first"),
        Message(role="tool", content="out", tool_call_id="c1", name="bash"),
        Message(role="user", content="a note"),
        Message(role="assistant", content="second"),
    ]
    logs = [TurnLog(turn=1, started_s=0.5, tools=[ToolRun(name="bash", exit_code=0)])]
    prelude, turns = split_turns(messages, logs)
    assert [m.content for m in prelude] == ["s", "task"]
    assert [[m.content for m in t.messages] for t in turns] == [
        ["first", "out", "a note"],
        ["second"],
    ]
    assert turns[0].tools[0].exit_code == 0 and turns[0].started_s == 0.5
    assert turns[1].tools == [] and turns[1].info is None


def test_results_stored_before_the_typed_trajectory_still_read() -> None:
    stored = {
        "reward": 1.0,
        "exit_reason": "submitted",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "turns": 1,
    }
    result = RolloutResult.model_validate(stored)
    assert result.turn_log == [] and result.messages[1].role == "assistant"
    assert result.model_dump(mode="json")["messages"] == stored["messages"]
